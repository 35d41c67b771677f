"""A module whose `main` has new binding blocks: what a pass that rewrites main's bindings returns."""
from __future__ import annotations

from tvm import relax


def with_main_blocks(builder, main, blocks):
    """`builder`'s module (it holds any functions the pass added) with `main`'s blocks replaced by `blocks`, and what
    no longer has a use removed."""
    main = relax.Function(main.params, relax.SeqExpr(blocks, main.body.body), main.ret_ty, main.is_pure,
                          main.attrs)
    builder.update_func(builder.get().get_global_var("main"), main)
    return relax.transform.DeadCodeElimination()(builder.get())
