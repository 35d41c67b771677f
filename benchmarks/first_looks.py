"""Every task's first look (clients.first_look) three ways, side by side, with the cost model untrained as at a
run's start: one after another ranking `population` samples (before), one after another sampling only what it keeps
(`sample_ranked` today), and drawn ahead with several at once (`first_look.Ahead`, as the search loop does where it
overlaps building and measuring).

  python benchmarks/first_looks.py --model bert_base.onnx --target nvidia/nvidia-h100 --threads 15 --at-once 1,2,4

No GPU is needed: the sampler lowers and verifies each schedule on the CPU. Each way starts from fresh contexts of one
seed; `--threads` is each context's (the search's threads: a GPU run's build cores).
"""
from __future__ import annotations

import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from design_spaces import arguments, model_tasks  # noqa: E402  (the same model, target and threads)


def main() -> None:
    parser = arguments(__doc__)
    parser.add_argument("--at-once", default="1,2,4", help="first looks drawn at once, each a row")
    args = parser.parse_args()
    from tvm.s_tir import meta_schedule as ms

    from tunekit.clients import first_look
    from tunekit.clients.design_spaces import generate_design_spaces
    from tunekit.clients.search_loop import search_contexts, start_search
    from tunekit.config import TuneConfig

    target, tasks = model_tasks(args)
    config = TuneConfig()
    keep = config.trials_per_iter * config.search_batches_for(target.kind.name)

    def fresh(work: str):
        cost_model = ms.cost_model.XGBModel()  # untrained: random scores, as at a run's start
        ctxs, _ = search_contexts(tasks, target, work, config=config, threads=args.threads)
        for ctx in ctxs:
            start_search(ctx, picks=keep, design_spaces=generate_design_spaces(ctx),
                         database=ms.database.MemoryDatabase(), cost_model=cost_model)
        return ctxs, cost_model

    rows = []
    with tempfile.TemporaryDirectory() as work:
        ctxs, cost_model = fresh(work)
        clock = time.perf_counter()
        found = [first_look.sample_ranked(c, _Trained(cost_model), population=config.population, keep=keep)
                 for c in ctxs]
        rows.append(("one after another, ranking the population", time.perf_counter() - clock, found))
        for at_once in [int(x) for x in args.at_once.split(",")]:
            ctxs, cost_model = fresh(work)
            clock = time.perf_counter()
            if at_once == 1:
                found = [first_look.sample_ranked(c, cost_model, population=config.population, keep=keep) for c in ctxs]
            else:
                ahead = first_look.Ahead(workers=at_once)
                for i, ctx in enumerate(ctxs):
                    ahead.start(i, ctx, cost_model, population=config.population, keep=keep)
                found = [ahead.take(i) for i in range(len(ctxs))]
                ahead.close()
            rows.append((f"sampling what it keeps, {at_once} at once", time.perf_counter() - clock, found))
    base = rows[0][1]
    print(f"{len(tasks)} tasks of {args.model}, {args.threads} threads each, {keep} kept per first look")
    print("| way | s | / before | candidates |\n| --- | ---: | ---: | ---: |")
    for name, seconds, found in rows:
        print(f"| {name} | {seconds:.2f} | {seconds / base:.3f} | {sum(len(f) for f in found)} |")


class _Trained:
    """The untrained model's random scores, taken for a trained model's: sample_ranked then draws `population`
    samples a round, as every first look did before it told the two apart."""

    def __init__(self, model):
        self._model = model

    def predict(self, ctx, candidates):
        return self._model.predict(ctx, candidates)


if __name__ == "__main__":
    main()
