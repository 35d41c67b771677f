"""Every task's design spaces drawn in turn and at once (clients.design_spaces.draw_at_once), side by side.

  python benchmarks/design_spaces.py --model resnet50.onnx --target nvidia/nvidia-h100 --threads 2 --rounds 2

No GPU is needed to draw a CUDA target's spaces. Each round draws them both ways from fresh contexts of one seed
and checks that the two give the same spaces.
"""
from __future__ import annotations

import argparse
import tempfile
import time


def contexts(tasks: list, seed: int, work_dir: str) -> list:
    from tvm.s_tir import meta_schedule as ms

    return ms.relax_integration.extracted_tasks_to_tune_contexts(tasks, work_dir, num_threads=1, seed=seed)[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="an ONNX file")
    parser.add_argument("--target", default="nvidia/nvidia-h100", help="a TVM target tag")
    parser.add_argument("--precision", default="fp16")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--seed", type=int, default=3)
    args = parser.parse_args()
    from tvm.target import Target

    from tunekit.clients.design_spaces import draw_at_once, generate_design_spaces
    from tunekit.frontend.precision import prepare
    from tunekit.frontend.tasks import already_scheduled, extract_tasks
    from tunekit.metaschedule_env import import_for_target, prepare_metaschedule_logging
    from tunekit.run.session import load_model

    target = Target(args.target)
    import_for_target(target.kind.name)
    prepare_metaschedule_logging()
    prepared, _ = prepare(load_model(args.model).mod, target, precision=args.precision)
    tasks = [t for t in extract_tasks(prepared, target) if not already_scheduled(t)]
    with tempfile.TemporaryDirectory() as work:
        for _ in range(args.rounds):
            ctxs = contexts(tasks, args.seed, work)
            clock = time.perf_counter()
            in_turn = [generate_design_spaces(ctx) for ctx in ctxs]
            turn_s = time.perf_counter() - clock
            ctxs = contexts(tasks, args.seed, work)
            clock = time.perf_counter()
            at_once = [future.result() for future in draw_at_once(ctxs, threads=args.threads)]
            once_s = time.perf_counter() - clock
            same = [[str(s.trace) for s in x] for x in in_turn] == [[str(s.trace) for s in x] for x in at_once]
            print(f"{len(tasks)} tasks: in turn {turn_s:.2f} s, at once on {args.threads} threads {once_s:.2f} s, "
                  f"ratio {once_s / turn_s:.3f}, same spaces: {same}", flush=True)


if __name__ == "__main__":
    main()
