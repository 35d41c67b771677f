"""Real conv tasks of the example model on llvm and their measure candidates, for the record tests
(test_useful_records.py, test_records_database.py, test_run_robust.py, test_tuning_database.py): no servers, nothing measured, the
run times are written by hand. Built once per test process, however many files use it."""
import functools
import tempfile


@functools.cache
def conv_task(model_path: str, index: int = 0):
    """The example model's `index`th conv task: (TuneContext, target, measure candidates, workload key)."""
    from tvm.s_tir import meta_schedule as ms
    from tvm.target import Target

    from tunekit.frontend.tasks import extract_tasks, prepare_for_tuning
    from tunekit.metaschedule_env import import_for_target, prepare_metaschedule_logging
    from tunekit.records.baselines import workload_key
    from tunekit.run.session import load_model

    import_for_target("llvm")  # as the engine does: not every backend's intrinsics
    prepare_metaschedule_logging()
    target = Target({"kind": "llvm", "num-cores": 1})
    prepared = prepare_for_tuning(load_model(model_path).mod, target)
    tasks = [t for t in extract_tasks(prepared, target) if "conv2d" in t.task_name][index:index + 1]
    (ctx,), _ = ms.relax_integration.extracted_tasks_to_tune_contexts(
        tasks, tempfile.mkdtemp(prefix="tunekit-conv-records-"), strategy="replay-trace", num_threads=1, seed=0)
    ctx.pre_tuning(max_trials=4, num_trials_per_iter=4, design_spaces=ctx.generate_design_space(),
                   database=ms.database.MemoryDatabase(), cost_model=ms.cost_model.RandomModel())
    candidates = ctx.generate_measure_candidates()
    assert len(candidates) >= 2
    return ctx, target, candidates, workload_key(ctx.mod)


def conv_records(model_path: str, index: int = 0):
    """(database, key): database(*secs, into=None, commit=None) commits the candidates in turn with these run
    times (a number, or a list of a record's runs) into a new MemoryDatabase (or `into`), through
    commit(db, record) if given; key is the workload's."""
    from tvm.s_tir import meta_schedule as ms

    ctx, target, candidates, key = conv_task(model_path, index)

    def database(*secs, into=None, commit=None):
        db = ms.database.MemoryDatabase() if into is None else into
        workload = db.commit_workload(ctx.mod)
        for candidate, s in zip(candidates, secs):
            record = ms.database.TuningRecord(candidate.sch.trace, workload, s if isinstance(s, list) else [s],
                                              target, candidate.args_info)
            db.commit_tuning_record(record) if commit is None else commit(db, record)
        return db

    return database, key
