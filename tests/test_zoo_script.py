"""benchmarks/zoo.py without torch: the registry, the journal's resume, the compact copies and the table."""
import importlib
import json
import lzma
import os
import sys

import numpy as np
import pytest

BENCHMARKS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks")


@pytest.fixture(scope="module")
def zoo():
    sys.path.insert(0, BENCHMARKS)
    try:
        return importlib.import_module("zoo")
    finally:
        sys.path.remove(BENCHMARKS)


REQUIRED = ("resnet18", "resnet50", "mobilenet_v2", "mobilenet_v3_small", "mobilenet_v3_large", "efficientnet_b0",
            "efficientnet_v2_s", "regnet_y_800mf", "densenet121", "convnext_tiny", "inception_v3",
            "shufflenet_v2_x1_0", "squeezenet1_1", "mnasnet1_0", "googlenet", "vit_b_16", "swin_t", "maxvit_t",
            "mobilevit_s", "deit_small_patch16_224", "bert_base", "distilbert", "roberta_base", "gpt2",
            "vit_b_16_dynamo")


def test_the_registry_holds_30_models_of_every_family_under_unique_names(zoo):
    names = [m.name for m in zoo.ZOO]
    assert len(names) >= 30 and len(set(names)) == len(names)
    assert {m.family for m in zoo.ZOO} == set(zoo.FAMILIES)
    assert not set(REQUIRED) - set(names)
    assert {m.source for m in zoo.ZOO} == {"torchvision", "timm", "transformers"}
    assert sum(m.source == "timm" for m in zoo.ZOO) >= 4  # mobilevit, deit and 2-3 of other families
    assert zoo.BY_NAME["inception_v3"].inputs[0].shape == (1, 3, 299, 299)
    assert all(i.shape == (1, 128) for n in ("bert_base", "distilbert", "roberta_base", "gpt2")
               for i in zoo.BY_NAME[n].inputs)
    assert [i.name for i in zoo.BY_NAME["gpt2"].inputs] == ["input_ids", "attention_mask"]
    assert zoo.BY_NAME["gpt2"].options["config_kwargs"] == {"use_cache": False}
    assert zoo.BY_NAME["vit_b_16_dynamo"].base == "vit_b_16" and zoo.BY_NAME["vit_b_16_dynamo"].dynamo
    small = {m.name for m in zoo.ZOO if m.small}
    assert "resnet18" in small and "gpt2" not in small and "vit_b_16" not in small
    for model in zoo.ZOO:
        assert model.inputs and model.outputs and model.source in ("torchvision", "timm", "transformers")


def test_selected_filters_by_name_and_smallness_and_refuses_unknown_names(zoo):
    assert [m.name for m in zoo.selected("gpt2,resnet18")] == ["gpt2", "resnet18"]
    assert [m.name for m in zoo.selected("gpt2,resnet18", small_only=True)] == ["resnet18"]
    assert "vit_b_16_dynamo" not in [m.name for m in zoo.selected(None, dynamo_vit=False)]
    assert len(zoo.selected(None)) == len(zoo.ZOO)
    with pytest.raises(SystemExit, match="resnet19"):
        zoo.selected("resnet18,resnet19")


def test_the_journal_keeps_the_newest_row_and_skips_a_cut_off_line(zoo, tmp_path):
    path = str(tmp_path / "zoo.jsonl")
    journal = zoo.Journal(path)
    assert journal.todo("check", "gpt2")
    journal.add({"step": "check", "model": "gpt2", "rc": 1, "error": "boom"})
    journal.add({"step": "check", "model": "gpt2", "rc": 0})
    with open(path, "a") as fh:
        fh.write('{"step": "check", "model": "resn')  # a run killed mid-write
    again = zoo.Journal(path)
    assert again.get("check", "gpt2")["rc"] == 0 and not again.todo("check", "gpt2")
    assert again.todo("check", "resnet18") and zoo.Journal(path, redo=True).todo("check", "gpt2")
    again.add({"step": "export", "model": "gpt2", "error": "no ONNX file written"})
    assert zoo.Journal(path, retry_failed=True).todo("export", "gpt2")
    assert not zoo.Journal(path, retry_failed=True).todo("check", "gpt2")


def _fake_check(zoo, monkeypatch, calls):
    def run_process(cmd, *, timeout, env=None):
        calls.append(cmd)
        assert os.path.isfile(cmd[cmd.index("check") + 1])  # the model (a compact copy: decompressed)
        payload = {"precision": "fp16", "tasks": [{"name": "conv", "tensorized": True},
                                                  {"name": "se_conv", "fallback": "Back optional access"}]}
        return zoo.Ran(1, json.dumps(payload), "", 0.5)

    monkeypatch.setattr(zoo, "run_process", run_process)


def test_a_recorded_step_is_skipped_and_redo_runs_it_again(zoo, tmp_path, monkeypatch):
    from tunekit.models.examples import save_example

    work = str(tmp_path)
    save_example("tiny_cnn", zoo.onnx_path(work, "resnet18"))
    calls = []
    _fake_check(zoo, monkeypatch, calls)
    argv = ["check", "--work", work, "--models", "resnet18,gpt2", "--gpu-arch", "sm_90"]
    zoo.main(argv)
    assert len(calls) == 1 and calls[0][1:4] == ["-m", "tunekit.cli", "check"]
    assert calls[0][4].endswith("resnet18.onnx") and calls[0][5:] == ["--gpu-arch", "sm_90", "--json"]
    zoo.main(argv)  # recorded: not run again; gpt2 has no ONNX file, so no row
    assert len(calls) == 1
    zoo.main([*argv, "--redo"])
    assert len(calls) == 2
    rows = zoo._read_jsonl(os.path.join(work, "zoo.jsonl"))
    assert [(r["step"], r["model"], r["rc"]) for r in rows] == [("check", "resnet18", 1)] * 2
    summary = zoo.check_summary(rows[-1]["json"])
    assert summary == {"precision": "fp16", "tasks": 2, "tensorized": 1,
                       "fallen": [["se_conv", "Back optional access"]]}


def test_check_compact_runs_on_the_decompressed_copy(zoo, tmp_path, monkeypatch):
    from tunekit.models.examples import save_example

    work = str(tmp_path)
    source = save_example("tiny_cnn", str(tmp_path / "src.onnx"))
    zoo.write_compact(source, zoo.compact_path(work, "resnet18"))
    calls = []
    _fake_check(zoo, monkeypatch, calls)
    zoo.main(["check", "--work", work, "--models", "resnet18", "--compact"])
    assert len(calls) == 1 and not os.path.exists(calls[0][calls[0].index("check") + 1])  # the temp copy is gone
    assert zoo.Journal(os.path.join(work, "zoo.jsonl")).get("check-compact", "resnet18")["rc"] == 1


def _initializers(model):
    from onnx import numpy_helper

    return {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}


@pytest.mark.parametrize("example", ["tiny_cnn", "transformer"])
def test_a_compact_copy_has_the_same_graph_with_constant_weights(zoo, tmp_path, example):
    import onnx

    from tunekit.models.examples import save_example

    source = save_example(example, str(tmp_path / f"{example}.onnx"))
    dst = str(tmp_path / "compact" / f"{example}.onnx.xz")
    counts = zoo.write_compact(source, dst)
    before = onnx.load(source)
    with lzma.open(dst) as fh:
        after = onnx.load_from_string(fh.read())
    onnx.checker.check_model(after)
    assert [n.op_type for n in after.graph.node] == [n.op_type for n in before.graph.node]
    assert [(i.name, i.type) for i in after.graph.input] == [(i.name, i.type) for i in before.graph.input]
    old, new = _initializers(before), _initializers(after)
    assert list(new) == list(old)
    filled = 0
    for name, value in new.items():
        assert value.shape == old[name].shape and value.dtype == old[name].dtype
        if value.dtype.kind == "f" and value.size > 1:
            assert len(np.unique(old[name])) > 1  # a weight: random before ...
            assert np.all(value == value.dtype.type(1.0 if value.ndim == 1 else 1.0 / (value.size // len(value))))
            filled += 1
        else:  # shapes, indices, scalar scales and epsilons: as they were
            assert np.array_equal(value, old[name])
    assert filled == counts["filled"] and filled >= 6
    if example == "tiny_cnn":  # conv weights 1 / (3*3*in), biases 1, the classifier's MatMul weight [32, 10]
        assert (new["w1"].flat[0], new["w2"].flat[0], new["b1"].flat[0], new["fc"].flat[0]) == \
            (np.float32(1 / 27), np.float32(1 / 144), 1.0, np.float32(1 / 10))
    if example == "transformer":
        assert any(v.dtype == np.int64 for v in new.values())  # Reshape shapes kept
    assert os.path.getsize(dst) < os.path.getsize(source)


def _variant(ms, cosine=1.0, rel=1e-3):
    return {"median_ms": ms, "errors": [{"max_abs_err": rel, "max_rel_err": rel, "cosine": cosine}]}


def _rows():
    ok_json = {"precision": "fp16", "tasks": [{"name": "conv"}]}
    return [
        {"step": "export", "model": "resnet18", "size_mb": 44.6},
        {"step": "check", "model": "resnet18", "rc": 0, "json": ok_json},
        {"step": "gpu-tune", "model": "resnet18", "rc": 0, "precision": "fp16", "untuned_ms": 0.5, "tuned_ms": 0.31,
         "fallbacks": [], "machine": "NVIDIA H200", "commit": "abc123"},
        {"step": "gpu-bench", "model": "resnet18", "p50_ms": 0.29, "precision": "fp16",
         "numerics": [{"name": "logits", "max_abs_err": 1e-3, "max_rel_err": 1e-3, "cosine": 0.99999}]},
        # fp16 at 40% is fastest but wrong (cosine 0.92): PyTorch's best correct at 40% is graphs-fp32
        {"step": "torch-gpu40", "model": "resnet18", "variants": {
            "graphs-fp32": _variant(0.4), "graphs-fp16": _variant(0.2, cosine=0.92), "maxautotune-fp32":
            {"variant": "maxautotune-fp32", "error": "InductorError: out of resources"}}},
        {"step": "torch-gpu100", "model": "resnet18", "variants": {"graphs-fp16": _variant(0.25),
                                                                   "graphs-fp32": _variant(0.1, cosine=float("nan"))}},
        # efficientnet_b0: the tune died; check says one task falls back
        {"step": "check", "model": "efficientnet_b0", "rc": 1, "json": {
            "summary": {"precision": "fp16", "tasks": 3}, "tasks": [
                {"name": "fused_conv2d_add", "fallback": "RuntimeError: Back optional access\nmore"}]}},
        {"step": "gpu-tune", "model": "efficientnet_b0", "rc": 1, "error": "tunekit: internal error: Back | optional"},
        {"step": "gpu-bench", "model": "efficientnet_b0", "error": "no artifact (the tune failed)"},
        {"step": "torch-gpu40", "model": "efficientnet_b0", "variants": {"graphs-fp32": _variant(0.3)}},
        # mobilenet_v2: beats both
        {"step": "gpu-tune", "model": "mobilenet_v2", "rc": 0, "precision": "fp32", "untuned_ms": 0.3, "tuned_ms": 0.12,
         "fallbacks": [["fused_conv2d9", "ScheduleError: split"]], "precision_fallback": "fp16 refused: NaN\nmore"},
        {"step": "torch-gpu40", "model": "mobilenet_v2", "variants": {"graphs-fp32": _variant(0.3)}},
        {"step": "torch-gpu100", "model": "mobilenet_v2", "variants": {"graphs-fp16": _variant(0.2)}},
        {"step": "export", "model": "gpt2", "error": "TypeError: cannot trace"},
        # swin_t: `tunekit check`'s own schema (tunekit.readiness.CheckResult.to_dict), fp16 refused
        {"step": "check-compact", "model": "swin_t", "rc": 1, "json": {
            "precision_requested": "auto", "precision_wanted": "fp16", "precision": "fp32", "tensorized_tasks": 0,
            "fallback_tasks": [], "ready": False, "tasks": [{"name": "matmul", "tensorized": False, "fallback": None}],
            "problems": ["precision: fp16 refused: Expected TensorType\ntrace", "another"]}},
    ]


def _journal(zoo, tmp_path, rows):
    journal = zoo.Journal(str(tmp_path / "zoo.jsonl"))
    for row in rows:
        journal.add(row)
    return journal


def _cells(text, model, *, gpu=False):
    """The model's row, without its GPU column unless `gpu`."""
    line = next(line for line in text.splitlines() if line.startswith(f"| {model} |"))
    cells = [c.strip() for c in line.strip("|").split("|")]
    return cells if gpu else cells[:2] + cells[3:]


def test_the_table_counts_only_correct_pytorch_variants_and_renders_failed_rows(zoo, tmp_path):
    text = zoo.table(_journal(zoo, tmp_path, _rows()), gpu_pct=40, header=["# zoo"])
    r18 = _cells(text, "resnet18")
    assert _cells(text, "resnet18", gpu=True)[2] == "H200" and _cells(text, "swin_t", gpu=True)[2] == "–"
    assert r18[:6] == ["resnet18", "vision CNN", "fp16", "0", "0", "0.500"]
    assert r18[6:11] == ["0.290", "0.400 (graphs-fp32)", "0.250 (graphs-fp16)", "0.72", "1.16"]
    assert "graphs-fp16" in r18[11] and "graphs-fp32" in r18[11]  # wrong at 40% and at 100% (NaN)
    eff = _cells(text, "efficientnet_b0")
    assert eff[2] == "fp16 (check)" and eff[3] == "1: fused_conv2d_add: RuntimeError: Back optional access"
    assert eff[4] == "1" and eff[6] == "–" and eff[7] == "0.300 (graphs-fp32)" and eff[9] == "–"
    assert "gpu-tune: tunekit: internal error: Back / optional" in eff[11]  # a | would break the row
    mv2 = _cells(text, "mobilenet_v2")
    assert mv2[3] == "1: fused_conv2d9: ScheduleError: split" and mv2[6] == "0.120"
    assert mv2[9] == "0.40" and mv2[10] == "0.60" and mv2[11] == "fp32 because: fp16 refused: NaN"
    assert _cells(text, "gpt2")[11] == "export: TypeError: cannot trace"
    swin = _cells(text, "swin_t")
    assert swin[2:5] == ["fp32 (check)", "0", "1 (compact)"]
    assert swin[11] == "check-compact: 2 problem(s), first: precision: fp16 refused: Expected TensorType"
    assert "on **2 of 2** models, and PyTorch fp16 at 100% on **1 of 2**" in text
    assert all(len(_cells(text, m)) == 12 for m in ("resnet18", "efficientnet_b0", "mobilenet_v2", "gpt2", "swin_t"))


def test_a_tuned_time_outside_its_bound_is_marked(zoo, tmp_path):
    rows = _rows()
    rows[3] = {**rows[3], "numerics": [{"name": "logits", "max_abs_err": 1, "max_rel_err": 0.5, "cosine": 0.5}]}
    assert _cells(zoo.table(_journal(zoo, tmp_path, rows)), "resnet18")[6] == "0.290†"


def test_the_table_command_writes_the_markdown_with_its_header(zoo, tmp_path):
    work = tmp_path / "work"
    _journal(zoo, work, _rows())
    out = str(tmp_path / "zoo.md")
    zoo.main(["table", "--work", str(work), "--out", out])
    text = open(out).read()
    assert text.startswith("# The model zoo") and "commit `" in text and "NVIDIA H200" in text
    assert _cells(text, "mobilenet_v2")[9] == "0.40"


def test_check_summary_reads_other_spellings_and_survives_junk(zoo):
    assert zoo.check_summary(None) == {"precision": None, "tasks": None, "tensorized": None, "fallen": []}
    assert zoo.check_summary({"precision": {"requested": "auto", "effective": "fp32"}, "task_count": 7,
                              "tensorized_tasks": ["a", "b"], "fallbacks": [{"task": "t3", "reason": "x"}]}) == \
        {"precision": "fp32", "tasks": 7, "tensorized": 2, "fallen": [["t3", "x"]]}


def test_a_tune_rows_reads_the_report_and_a_failure_keeps_the_error_line(zoo):
    payload = {"untuned_ms": 2.0, "tuned_ms": 1.0, "trials": 8, "artifact": "/a/model.so",
               "report": {"precision": "fp32", "session_failures": 2, "precision_fallback": "fp16 refused\nmore",
                          "tasks": [{"name": "a", "untuned_error": "run: broke\nmore"}, {"name": "c", "untuned_error": "run: broke"},
                                    {"name": "b", "fallback": "why\nmore"}]}}
    row = zoo.tune_row("cpu-tune", "resnet18", zoo.Ran(0, json.dumps(payload), "", 3.0), timeout=60)
    assert (row["tuned_ms"], row["tasks"], row["fallbacks"], row["precision"]) == (1.0, 3, [["b", "why"]], "fp32")
    assert (row["untuned_errors"], row["session_failures"]) == ({"run: broke": 2}, 2)  # why the baselines failed
    assert row["precision_fallback"] == "fp16 refused\nmore"  # why auto tuned in fp32
    roofed = {"report": {"roofline": {"sm_count": 52}, "tasks": [
        {"name": "gemm", "weight": 12, "untuned_us": 90.0, "tuned_us": 30.0, "record_applied": True,
         "efficiency": {"roofline_fraction": 0.11, "bound": "memory", "kernel": "tuned, tensor cores"}},
        {"name": "kept", "weight": 1, "untuned_us": 200.0, "tuned_us": 5.0, "record_applied": False},
        {"name": "small", "weight": 1, "untuned_us": 3.0, "tuned_us": 1.0}]}}
    slow = zoo.tune_row("gpu-tune", "vit", zoo.Ran(0, json.dumps(roofed), "", 3.0), timeout=60)["slowest_tasks"]
    assert [(t["name"], t["us"]) for t in slow] == [("gemm", 30.0), ("kept", 200.0), ("small", 1.0)]  # 12 x 30 first
    assert slow[0]["roofline_fraction"] == 0.11 and slow[0]["bound"] == "memory" and slow[1]["kernel"] is None
    failed = zoo.tune_row("cpu-tune", "maxvit_t", zoo.Ran(1, "", "progress\ntunekit: internal error: X\n", 3.0),
                          timeout=60)
    assert failed["error"] == "tunekit: internal error: X" and "tuned_ms" not in failed
    assert zoo.tune_row("cpu-tune", "m", zoo.Ran(None, "", "", 60), timeout=60)["error"] == "timed out after 60 s"


def _fake_gpu(zoo, monkeypatch, calls, *, torch_plan):
    """tunekit tune / bench and torch_models.py time as fakes; torch_plan: per time process, (variants it
    prints, rc) in order (rc None: it ran out of time)."""
    def run_process(cmd, *, timeout, env=None):
        calls.append(cmd)
        if "torch_models.py" in cmd[1]:
            asked = cmd[cmd.index("--variants") + 1].split(",")
            printed, rc = torch_plan.pop(0)
            lines = [json.dumps({"variant": v, "median_ms": 0.5, "errors": [{"max_rel_err": 0, "cosine": 1}]})
                     for v in asked[:printed]]
            return zoo.Ran(rc, "\n".join(lines), "RuntimeError: CUDA error: out of memory\n" if rc else "", 1.0)
        if cmd[3] == "tune":
            payload = {"untuned_ms": 1.0, "tuned_ms": 0.4, "artifact": "/x/model.tkart", "trials": 99,
                       "report": {"precision": "fp16", "tasks": [{"name": "a"}]}}
            return zoo.Ran(0, json.dumps(payload), "", 130.0)
        return zoo.Ran(0, json.dumps({"p50_ms": 0.39, "numerics": {"outputs": []}}), "", 20.0)

    monkeypatch.setattr(zoo, "run_process", run_process)
    monkeypatch.setattr(zoo.Context, "gpu_env", lambda self, pct: {"PCT": str(pct)})


def test_the_gpu_step_goes_on_after_a_variant_times_out_and_skips_what_is_recorded(zoo, tmp_path, monkeypatch):
    from tunekit.models.examples import save_example

    work = str(tmp_path)
    save_example("tiny_cnn", zoo.onnx_path(work, "resnet18"))
    calls = []
    # at 40%: the 1st process prints one variant and hangs in the 2nd (timed out), the next prints the rest;
    # at 100% (fp16 alone): the process crashes after one variant: the crash's line is every variant's it left
    _fake_gpu(zoo, monkeypatch, calls, torch_plan=[(1, None), (2, 0), (1, 1)])
    argv = ["gpu", "--work", work, "--models", "resnet18", "--torch-variants",
            "eager-fp32,graphs-fp32,eager-fp16,graphs-fp16",
            "--time-budget", "60"]
    zoo.main(argv)
    tune, bench = calls[0], calls[1]
    assert tune[3:5] == ["tune", zoo.onnx_path(work, "resnet18")] and "--resume" in tune
    assert tune[tune.index("--time-budget") + 1] == "60" and tune[tune.index("--gpu-pct") + 1] == "40"
    assert bench[3:5] == ["bench", "/x/model.tkart"] and "--compare-onnx" in bench
    assert [c[c.index("--variants") + 1] for c in calls[2:]] == \
        ["eager-fp32,graphs-fp32,eager-fp16,graphs-fp16", "eager-fp16,graphs-fp16", "eager-fp16,graphs-fp16"]
    assert all("--channels-last" in c for c in calls[2:])  # a CNN
    journal = zoo.Journal(os.path.join(work, "zoo.jsonl"))
    at40 = journal.get("torch-gpu40", "resnet18")["variants"]
    at100 = journal.get("torch-gpu100", "resnet18")["variants"]
    assert at40["graphs-fp32"]["error"].startswith("timed out") and at40["graphs-fp16"]["median_ms"] == 0.5
    assert at100["eager-fp16"]["median_ms"] == 0.5 and "eager-fp32" not in at100 and "graphs-fp32" not in at100
    assert at100["graphs-fp16"]["error"] == "RuntimeError: CUDA error: out of memory"
    assert journal.get("gpu-bench", "resnet18")["p50_ms"] == 0.39
    zoo.main(argv)  # everything recorded: nothing runs
    assert len(calls) == 5
    _fake_gpu(zoo, monkeypatch, calls, torch_plan=[(1, 0), (1, 0)])
    zoo.main([*argv, "--retry-failed"])  # only the failed variants run again; the tune stays
    assert [c[c.index("--variants") + 1] for c in calls[5:]] == ["graphs-fp32", "graphs-fp16"]


def test_call_s_stops_before_a_tune_that_would_not_fit(zoo, tmp_path, monkeypatch):
    from tunekit.models.examples import save_example

    work = str(tmp_path)
    save_example("tiny_cnn", zoo.onnx_path(work, "resnet18"))
    calls = []
    _fake_gpu(zoo, monkeypatch, calls, torch_plan=[])
    zoo.main(["gpu", "--work", work, "--models", "resnet18", "--time-budget", "120", "--call-s", "200"])
    assert calls == [] and zoo.Journal(os.path.join(work, "zoo.jsonl")).rows == {}


def test_compile_variants_run_only_at_the_compile_pcts(zoo, tmp_path, monkeypatch):
    from tunekit.models.examples import save_example

    work = str(tmp_path)
    save_example("tiny_cnn", zoo.onnx_path(work, "gpt2"))
    calls = []
    _fake_gpu(zoo, monkeypatch, calls, torch_plan=[(2, 0), (1, 0)])
    zoo.main(["gpu", "--work", work, "--models", "gpt2", "--torch-variants", "graphs-fp16,maxautotune-fp16",
              "--compile-pcts", "40"])
    torch_calls = [c for c in calls if "torch_models.py" in c[1]]
    assert [c[c.index("--variants") + 1] for c in torch_calls] == ["graphs-fp16,maxautotune-fp16", "graphs-fp16"]
    assert all("--channels-last" not in c for c in torch_calls)  # a text model


def test_without_options_drops_each_named_option_and_its_value(zoo):
    argv = ["gpu", "--work", "w", "--gpus", "0,1", "--models=a,b", "--gpu-pct", "40"]
    assert zoo._without_options(argv, ("--gpus", "--models")) == ["gpu", "--work", "w", "--gpu-pct", "40"]


@pytest.mark.e2e
def test_gpus_runs_one_sweep_per_gpu_and_merges_their_journals(zoo, tmp_path):
    """Two sweeps side by side (real processes); on a CPU machine each model's steps record the error of a GPU
    share, which is enough to show both sweeps ran, each model once, and their journals were merged."""
    import subprocess

    from tunekit.models.examples import save_example
    from tunekit.shares.mps import gpu_present

    if gpu_present():
        pytest.skip("a GPU here would tune for real")
    work = str(tmp_path)
    for name in ("resnet18", "squeezenet1_1", "mobilenet_v2"):
        save_example("tiny_cnn", zoo.onnx_path(work, name))
    proc = subprocess.run([sys.executable, os.path.join(BENCHMARKS, "zoo.py"), "gpu", "--work", work, "--gpus", "0,1",
                           "--models", "resnet18,squeezenet1_1,mobilenet_v2", "--torch-variants", "eager-fp32"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = zoo._read_jsonl(os.path.join(work, "zoo.jsonl"))
    tuned = sorted(r["model"] for r in rows if r["step"] == "gpu-tune")
    assert tuned == ["mobilenet_v2", "resnet18", "squeezenet1_1"], rows
    assert not [f for f in os.listdir(work) if f.startswith("zoo-gpu")]


def test_a_gpu_sweeps_journal_left_by_a_cut_off_run_is_merged_by_the_next(zoo, tmp_path):
    work = str(tmp_path)
    row = {"time": "2026-11-27T12:00:00", "step": "gpu-tune", "model": "resnet18", "error": "cut off"}
    (tmp_path / "zoo-gpu1.jsonl").write_text(json.dumps(row) + "\n")
    zoo.main(["gpu", "--work", work, "--models", "resnet18"])  # not exported: nothing runs
    assert zoo._read_jsonl(os.path.join(work, "zoo.jsonl")) == [row]
    assert not (tmp_path / "zoo-gpu1.jsonl").exists()


def test_a_zero_initialized_head_or_norm_scale_gets_values_so_the_outputs_can_be_checked():
    """torchvision's ViT starts with a zero head: its logits were all zero and every build matched the reference."""
    torch = pytest.importorskip("torch")
    sys.path.insert(0, BENCHMARKS)
    try:
        torch_models = importlib.import_module("torch_models")
    finally:
        sys.path.remove(BENCHMARKS)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.BatchNorm1d(8), torch.nn.Linear(8, 4))
    torch.nn.init.zeros_(model[2].weight)
    torch.nn.init.zeros_(model[1].weight)
    kept = model[0].weight.detach().clone()
    torch_models._no_zero_layers(model)
    assert model[2].weight.abs().max() > 0 and bool((model[1].weight == 1).all())
    assert torch.equal(model[0].weight, kept)  # random weights stay as they were
    assert model.eval()(torch.randn(2, 8)).abs().max() > 0
