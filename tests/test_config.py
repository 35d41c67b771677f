"""TuneConfig: its groups, its per-field checks, removed keys, experimental fields, and flag > YAML > default."""
import dataclasses
import warnings

import pytest

from tunekit import config as config_module
from tunekit.config import SearchOptions, TuneConfig, load_yaml_config
from tunekit.errors import TunekitError
from tunekit.experimental import ExperimentalWarning


def test_search_options_are_one_group_read_by_target():
    config = TuneConfig(search={"population": 256, "batches": 3})
    assert config.search == SearchOptions(population=256, batches=3)
    assert config.population == 256 and config.search_batches_for("cuda") == 3 == config.search_batches_for("llvm")
    default = TuneConfig()
    assert default.pipeline_depth_for("cuda") == 4 and default.pipeline_depth_for("llvm") == 2
    assert default.genetic_iters_for("cuda") == 2 and default.genetic_iters_for("llvm") == 3
    assert default.population == 128 and TuneConfig(trials_per_iter=64).population == 512
    assert TuneConfig(search=SearchOptions(pipeline_depth=3)).pipeline_depth_for("cuda") == 3
    # a round trip through a dict (how the coordinator ships it to its clients) keeps the group
    assert TuneConfig(**dataclasses.asdict(config)).search == config.search
    with pytest.raises(TunekitError, match=r"search.pipeline_depth must be a positive integer, got 0"):
        TuneConfig(search={"pipeline_depth": 0})
    with pytest.raises(TunekitError, match=r"unknown key\(s\) under search: \['depth'\]"):
        TuneConfig(search={"depth": 2})


@pytest.mark.parametrize("name, bad", [
    ("trials", 0), ("trials_per_iter", True), ("servers", -1), ("measure_repeats", "5"), ("seed", 1.5),
    ("builder_workers", 0), ("build_timeout_s", 0), ("session_timeout_s", -2.0), ("servers_gone_timeout_s", False),
    ("share_wait_s", -1), ("min_task_share", 1.0), ("max_output_error", 0), ("min_output_cosine", 1.5),
    ("listen_host", " "), ("warm_start", "dir"), ("robust", "yes"), ("precision", "int8"), ("engine", "fast"),
    ("overlap", "sometimes"), ("measure_lock", 1), ("time_budget_s", 0),
])
def test_every_field_refuses_a_bad_value_in_one_line_naming_it(name, bad):
    with pytest.raises(TunekitError) as error:
        TuneConfig(**{name: bad})
    message = str(error.value)
    assert "\n" not in message and (name in message or "--time-budget" in message), message


def test_a_removed_or_moved_yaml_key_fails_with_one_line_naming_it(tmp_path):
    path = tmp_path / "old.yaml"
    for key, says in (("search_in_background: true", "search_in_background was removed"),
                      ("client_cores: split", "unknown key(s) ['client_cores']"),
                      ("task_scheduler: score", "task_scheduler was removed"),
                      ("server_mode: stock", "server_mode was removed: it follows engine"),
                      ("search_population: 64", "search_population was moved: write `search: {population: ...}`"),
                      ("pipeline_depth: 3", "pipeline_depth was moved")):
        path.write_text(f"trials: 8\n{key}\n")
        with pytest.raises(TunekitError) as error:
            load_yaml_config(str(path))
        assert says in str(error.value) and "\n" not in str(error.value), str(error.value)
    path.write_text("trials: 8\nsearch: {population: 64}\n")
    assert TuneConfig(**load_yaml_config(str(path))).population == 64


def test_every_removed_key_is_really_gone():
    fields = {f.name for f in dataclasses.fields(TuneConfig)}
    assert not fields & set(config_module.REMOVED_KEYS)


def test_an_experimental_field_warns_only_when_it_is_set(monkeypatch):
    monkeypatch.setattr(config_module, "EXPERIMENTAL", frozenset({"robust"}))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        TuneConfig()  # left at its default: silent
    with pytest.warns(ExperimentalWarning, match="robust is experimental"):
        TuneConfig(robust=True)


def test_the_measurement_lock_is_per_device_or_none():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for setting in (True, False, "auto"):
            TuneConfig(measure_lock=setting)
    with pytest.raises(TunekitError, match="measure_lock must be true, false or auto"):
        TuneConfig(measure_lock="share")  # shares side by side time up to 26% slower (benchmarks/RESULTS.md)


def test_a_flag_beats_the_yaml_which_beats_the_default(tmp_path):
    from tunekit.cli import build_parser
    from tunekit.cli.tune import tune_config

    path = tmp_path / "c.yaml"
    path.write_text("trials: 32\nseed: 7\nsearch: {batches: 2}\nmeasure_lock: false\n")
    args = build_parser().parse_args(["tune", "m.onnx", "--config", str(path), "--trials", "16"])
    config = tune_config(args)
    assert (config.trials, config.seed, config.search.batches, config.measure_lock) == (16, 7, 2, False)
    assert config.trials_per_iter == TuneConfig().trials_per_iter  # neither: the default
    assert (config.engine, config.server_mode) == ("tunekit", "warm")
    stock = tune_config(build_parser().parse_args(["tune", "m.onnx", "--engine", "stock"]))
    assert stock.server_mode == "stock"  # derived from the engine, no key of its own


def test_a_time_budget_alone_ends_the_run_and_given_trials_still_cap_it(tmp_path):
    """`--time-budget 600` without `--trials` tunes for 600 s (it stopped at the default 64 trials, long before);
    trials given by flag or YAML still cap the run; neither: 64."""
    from tunekit.cli import build_parser
    from tunekit.cli.tune import tune_config

    def config_of(*argv):
        return tune_config(build_parser().parse_args(["tune", "m.onnx", *argv]))

    assert TuneConfig().trials == 64 and TuneConfig().trials_bounded
    alone = config_of("--time-budget", "600")
    assert not alone.trials_bounded and alone.trials > 10 ** 5
    assert config_of("--time-budget", "600", "--trials", "100").trials == 100
    path = tmp_path / "c.yaml"
    path.write_text("time_budget_s: 60\n")
    assert not config_of("--config", str(path)).trials_bounded
    path.write_text("time_budget_s: 60\ntrials: 32\n")
    assert config_of("--config", str(path)).trials == 32
