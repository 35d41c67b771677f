"""Config dataclasses. YAML files in configs/ map onto TuneConfig; CLI flags override them
(flag > YAML > default). Each field is checked by one row of a table (`_CHECKS`)."""
from __future__ import annotations

import dataclasses
import os
import re
from dataclasses import dataclass, field

from .errors import TunekitError
from .experimental import warn_experimental_argument


# ---- checks: each returns True for a valid value
def _positive_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def _optional_positive_int(value) -> bool:
    return value is None or _positive_int(value)


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _positive_number(value) -> bool:
    return _number(value) and value > 0


def _flag(value) -> bool:
    return isinstance(value, bool)


def _one_of(*choices):
    return lambda value: any(value is c or (not isinstance(c, bool) and value == c) for c in choices)


@dataclass
class SearchOptions:
    """MetaSchedule's evolutionary search as tunekit drives it (the arguments of ms.EvolutionarySearch, plus how
    many batches one search serves and how many batches are in flight). None: by target (see TuneConfig)."""

    population: int | None = None     # None: 8 x trials_per_iter within 128..512
    genetic_iters: int | None = None  # None: 2 on CUDA, 3 on CPU
    init_samples: int | None = None   # valid random samples first; None: max(16, trials_per_iter) <= 50 on CUDA, 50 on CPU
    batches: int | None = None        # batches one search picks for; None: 4 on CUDA, 1 on CPU
    pipeline_depth: int | None = None  # batches in flight when overlapping; None: 4 on CUDA, 2 on CPU

    def __post_init__(self):
        for f in dataclasses.fields(self):
            if not _optional_positive_int(getattr(self, f.name)):
                raise TunekitError(f"search.{f.name} must be a positive integer, got {getattr(self, f.name)!r}")


DEFAULT_TRIALS = 64
UNBOUNDED_TRIALS = 10 ** 6  # the trials of a run that only a time budget ends (--time-budget without --trials)


@dataclass
class TuneConfig:
    """Every setting of a tuning run. Each key is one YAML key; the common ones are also `tunekit tune` flags."""

    # ---- the run
    trials: int | None = None        # total measured candidates over all tasks; None: 64, or unbounded with a time budget
    seed: int = 0
    input_shapes: dict[str, list[int]] = field(default_factory=dict)
    resume: bool = False             # continue the records already in --out (same model/target/share only)
    engine: str = "tunekit"          # "tunekit" (fast loop, warm servers) or "stock" (ms.tune_tasks, TVM's rpc_server)
    precision: str = "auto"          # auto: fp16 (+NHWC, fp32 accumulation) on tensor-core GPUs, fp32 on CPU
    # Refuse an artifact whose outputs differ from onnxruntime's fp32 by more than this (max abs error over the
    # reference's largest magnitude), or whose cosine similarity is below the second; None: tunekit.numerics.BOUNDS
    max_output_error: float | None = None
    min_output_cosine: float | None = None
    robust: bool = False             # several shares: also the share-robust artifact (run.robust)
    # ---- search, build and the loop
    trials_per_iter: int = 8         # candidates per build/measure batch (small: every task gets a turn early)
    builder_workers: int | None = None  # default: the cores this process may use
    build_timeout_s: float = 120.0
    overlap: bool | str = "auto"     # build batch N+1 while N is measured; auto: on a GPU only (clients.measurement)
    min_task_share: float = 0.005    # tasks under this share of the untuned weight x latency are not tuned
    # a fleet's objective: "sum" of its models' weighted latencies (Ansor's), or their weighted "geomean" (Ansor's
    # f3: each model's relative gain counts); auto: geomean in one process, the sum over --clients or --engine stock,
    # whose shards split only the sum (benchmarks/RESULTS.md, "A fleet for its geometric mean on the GPU")
    fleet_objective: str = "auto"
    time_budget_s: float | None = None  # stop launching batches after this many seconds of tuning
    # Warm start (clients.warm_start): tune out dirs / record dirs whose best records per task are measured
    # again at this share before the search; their cost model is loaded when none is here.
    warm_start: list[str] = field(default_factory=list)
    search: SearchOptions = field(default_factory=SearchOptions)
    # ---- measurement
    servers: int = 1                 # runner servers at the share
    session_timeout_s: float = 120.0
    allow_unenforced_share: bool = False  # GPU without MPS: loudly labelled in the report
    # Other jobs on this machine (shares.ledger): each job books pct x servers of its device; past 100% it is
    # refused, unless it may wait up to share_wait_s for others to leave, or oversubscribe.
    oversubscribe: bool = False
    share_wait_s: float = 0.0
    # One measurement at a time per device (shares.measure_lock): "auto" = on a GPU only (servers there
    # share memory bandwidth and L2; CPU shares have disjoint cores), true, false.
    measure_lock: bool | str = "auto"
    measure_repeats: int = 20        # latency repeats for before/after numbers
    # ---- faults and security (docs/running.md, "Security"): no runner server of the share reachable for this long
    # (restarts keep failing) stops the run with a clear error, keeping every measured trial.
    servers_gone_timeout_s: float = 120.0
    listen_host: str = "127.0.0.1"   # tracker + runner servers; not loopback: needs a shared secret
    rpc_secret_file: str | None = None  # shared secret (first line); else env TUNEKIT_RPC_SECRET

    @property
    def trials_bounded(self) -> bool:
        """Whether the trials end the run; not when only a time budget was given."""
        return self.trials < UNBOUNDED_TRIALS

    def with_trials(self, trials: int | None) -> "TuneConfig":
        """This config with `trials` replaced (None keeps it): the API's `trials=` argument."""
        return self if trials is None else dataclasses.replace(self, trials=trials)

    @property
    def server_mode(self) -> str:
        """The runner servers the engine measures on: tunekit's warm servers, or TVM's own rpc_server."""
        return "stock" if self.engine == "stock" else "warm"

    # The search's defaults by target: on 2 cores 87% of a 32-trial CPU run was MetaSchedule's default
    # search, and ~97% of random CUDA conv schedules fail VerifyGPUCode (benchmarks/RESULTS.md, "Search cost").
    @property
    def population(self) -> int:
        if self.search.population is not None:
            return self.search.population
        return min(512, max(128, 8 * self.trials_per_iter))

    def genetic_iters_for(self, target_kind: str) -> int:
        if self.search.genetic_iters is not None:
            return self.search.genetic_iters
        return 2 if target_kind == "cuda" else 3

    def search_batches_for(self, target_kind: str) -> int:
        if self.search.batches is not None:
            return self.search.batches
        return 4 if target_kind == "cuda" else 1

    def pipeline_depth_for(self, target_kind: str) -> int:
        if self.search.pipeline_depth is not None:
            return self.search.pipeline_depth
        return 4 if target_kind == "cuda" else 2

    def init_samples_for(self, target_kind: str) -> int:
        if self.search.init_samples is not None:
            return self.search.init_samples
        return min(50, max(16, self.trials_per_iter)) if target_kind == "cuda" else 50

    def __post_init__(self):
        if self.trials is None:  # decided once the time budget is known (flag > YAML > default)
            self.trials = UNBOUNDED_TRIALS if self.time_budget_s is not None else DEFAULT_TRIALS
        if isinstance(self.search, dict):  # from YAML
            unknown = sorted(set(self.search) - {f.name for f in dataclasses.fields(SearchOptions)})
            if unknown:
                raise TunekitError(f"unknown key(s) under search: {unknown}; known: "
                                   f"{[f.name for f in dataclasses.fields(SearchOptions)]}")
            self.search = SearchOptions(**self.search)
        if not isinstance(self.search, SearchOptions):
            raise TunekitError(f"search must be a mapping of search options, got {self.search!r}")
        for name, (valid, expected) in _CHECKS.items():
            if not valid(getattr(self, name)):
                raise TunekitError(f"{name} must be {expected}, got {getattr(self, name)!r}")
        if self.time_budget_s is not None and not _positive_number(self.time_budget_s):
            raise TunekitError(f"--time-budget must be a positive number of seconds, got {self.time_budget_s!r}")
        for f in dataclasses.fields(TuneConfig):
            if f.name in EXPERIMENTAL and getattr(self, f.name) != _default(f):
                warn_experimental_argument(f.name)


def _default(f: dataclasses.Field):
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default


# field -> (check, what a valid value is). time_budget_s has its own line: its error names the flag.
_CHECKS = {
    "trials": (_positive_int, "a positive integer"),
    "trials_per_iter": (_positive_int, "a positive integer"),
    "servers": (_positive_int, "a positive integer"),
    "measure_repeats": (_positive_int, "a positive integer"),
    "seed": (lambda v: isinstance(v, int) and not isinstance(v, bool), "an integer"),
    "builder_workers": (_optional_positive_int, "a positive integer"),
    "build_timeout_s": (_positive_number, "a positive number of seconds"),
    "session_timeout_s": (_positive_number, "a positive number of seconds"),
    "servers_gone_timeout_s": (_positive_number, "a positive number of seconds"),
    "share_wait_s": (lambda v: _number(v) and v >= 0, "a number of seconds >= 0 (--wait-for-share)"),
    "min_task_share": (lambda v: _number(v) and 0 <= v < 1, "a fraction in [0, 1)"),
    "max_output_error": (lambda v: v is None or _positive_number(v), "a positive number"),
    "min_output_cosine": (lambda v: v is None or (_number(v) and 0 < v <= 1), "a number in (0, 1]"),
    "listen_host": (lambda v: isinstance(v, str) and bool(v.strip()), "a host address"),
    "rpc_secret_file": (lambda v: v is None or isinstance(v, str), "a file path"),
    "warm_start": (lambda v: isinstance(v, list) and all(isinstance(d, str) for d in v), "a list of directories"),
    "input_shapes": (lambda v: isinstance(v, dict), "a mapping of input name to shape"),
    "resume": (_flag, "true or false"),
    "robust": (_flag, "true or false"),
    "oversubscribe": (_flag, "true or false"),
    "allow_unenforced_share": (_flag, "true or false"),
    "precision": (_one_of("auto", "fp32", "fp16"), "auto, fp32 or fp16"),
    "engine": (_one_of("tunekit", "stock"), "'tunekit' or 'stock'"),
    "overlap": (_one_of(True, False, "auto"), "true, false or auto"),
    "measure_lock": (_one_of(True, False, "auto"), "true, false or auto"),
    "fleet_objective": (_one_of("auto", "sum", "geomean"), "auto, 'sum' or 'geomean'"),
}

# Fields that ship experimental: setting one warns (tunekit.experimental) until a benchmark keeps or deletes it.
EXPERIMENTAL: frozenset[str] = frozenset()

# YAML keys of earlier versions: a file that still sets one fails with one line, never silently.
REMOVED_KEYS = {
    "search_per_share": "removed: several shares always share one search",
    "gpu_shared_memory": "removed: the search uses the static 48 KB per block",
    "reserve_ahead": "removed: always on",
    "reserve_from_pool": "removed: it lost (benchmarks/RESULTS.md)",
    "search_in_background": "removed: it lost (benchmarks/RESULTS.md)",
    "measure_untuned_tasks": "removed: every task is measured untuned once",
    "task_scheduler": "removed: the gradient rule is the only scheduler",
    "async_cost_model": "removed: the cost model always trains on its own thread",
    "server_mode": "removed: it follows engine (stock: TVM's rpc_server)",
    "stock_runner": "removed: it follows engine and the device",
    "search_first_look": "removed: always on",
    "warm_start_top_k": "removed: 2 records per task are warm-started",
    "min_repeat_ms": "removed: fixed at 20 ms",
    **{f"search_{name}": f"moved: write `search: {{{name}: ...}}`"
       for name in ("population", "genetic_iters", "init_samples", "batches")},
    "pipeline_depth": "moved: write `search: {pipeline_depth: ...}`",
}


def check_keys(keys, *, where: str) -> None:
    """One line for the first removed or unknown key among `keys` (a YAML file's, or the API's)."""
    for key in keys:
        if key in REMOVED_KEYS:
            raise TunekitError(f"{where}: {key} was {REMOVED_KEYS[key]}")
    known = {f.name for f in dataclasses.fields(TuneConfig)} | {"gpu_pct", "cpu_pct", "out"}
    unknown = sorted(set(keys) - known)
    if unknown:
        raise TunekitError(f"{where}: unknown key(s) {unknown}; known keys: {sorted(known)}")


@dataclass(frozen=True)
class FleetModel:
    """One model of a fleet (api.tune_fleet): its ONNX file, its share and its weight in the fleet's objective,
    the weighted sum of the models' latencies (its request rate, or how much it matters)."""

    model: str
    gpu_pct: int | None = None        # the fleet's share when both are None
    cpu_pct: int | None = None
    weight: float = 1.0
    name: str | None = None           # its out dir under the fleet's (default: the file's stem)

    def __post_init__(self):
        if not isinstance(self.weight, (int, float)) or isinstance(self.weight, bool) or not self.weight > 0:
            raise TunekitError(f"{self.model}: a fleet model's weight must be a number > 0, got {self.weight!r}")
        if self.gpu_pct is not None and self.cpu_pct is not None:
            raise TunekitError(f"{self.model}: give gpu_pct or cpu_pct, not both")


_FLEET_MODEL_KEYS = {f.name for f in dataclasses.fields(FleetModel)}


def load_fleet_file(path: str) -> tuple[list[FleetModel], dict]:
    """A fleet YAML: `models:` (a list of FleetModel mappings, or ONNX paths), the fleet's share (`gpu_pct`
    or `cpu_pct`), `out`, and any TuneConfig key. Model paths are relative to the file. Returns (models, the
    other keys)."""
    values = load_yaml_config(path, fleet=True)
    entries = values.pop("models", None)
    if not isinstance(entries, list) or not entries:
        raise TunekitError(f"{path}: a fleet file needs `models:`, a list of ONNX paths or mappings with `model:`")
    here = os.path.dirname(os.path.abspath(path))
    models = []
    for entry in entries:
        entry = {"model": entry} if isinstance(entry, str) else entry
        if not isinstance(entry, dict) or not isinstance(entry.get("model"), str):
            raise TunekitError(f"{path}: each of `models:` is an ONNX path or a mapping with `model:`, got {entry!r}")
        unknown = sorted(set(entry) - _FLEET_MODEL_KEYS)
        if unknown:
            raise TunekitError(f"{path}: unknown key(s) {unknown} in a model; known: {sorted(_FLEET_MODEL_KEYS)}")
        models.append(FleetModel(**{**entry, "model": os.path.join(here, os.path.expanduser(entry["model"]))}))
    return models, values


@dataclass
class CoordinatorConfig:
    """How a run is spread over Ray: tuning clients per share, GPUs for the servers, the cluster."""

    clients: int = 2                  # tuning clients per share (Ray actors)
    gpus: list[int] | None = None     # GPU indices to put servers on (default: every visible GPU)
    ray_address: str | None = None    # join this Ray cluster (default: RAY_ADDRESS, else start Ray here)
    oversubscribe: bool = False       # allow the shares on one device to sum past 100%
    client_restarts: int = 2          # how often a client that died is started again, per shard
    # Which Ray nodes host the tuning clients (CPU work: search, build): "any" (Ray spreads them),
    # "cpu-only" (nodes without GPUs) or the name of a Ray custom resource that client nodes
    # advertise (e.g. tunekit_client). Fleets stay on the nodes of the device they measure.
    client_nodes: str = "any"

    def __post_init__(self):
        if not isinstance(self.clients, int) or isinstance(self.clients, bool) or self.clients < 1:
            raise TunekitError(f"--clients must be a positive integer, got {self.clients!r}")
        if not isinstance(self.client_nodes, str) or not re.fullmatch(r"[A-Za-z0-9_.:/-]+", self.client_nodes):
            raise TunekitError(f"--client-nodes must be any, cpu-only or a Ray custom resource name such as "
                               f"tunekit_client, got {self.client_nodes!r}")
        if self.client_nodes in ("CPU", "GPU", "memory", "object_store_memory"):
            raise TunekitError(f"--client-nodes {self.client_nodes}: name a custom resource that only client "
                               "nodes advertise (e.g. tunekit_client), or use cpu-only")


def load_yaml_config(path: str, *, fleet: bool = False) -> dict:
    import yaml

    if not os.path.isfile(path):
        raise TunekitError(f"config file not found: {path}")
    try:
        with open(path) as fh:
            data = yaml.safe_load(fh) or {}
    except yaml.YAMLError as exc:
        raise TunekitError(f"{path} is not valid YAML: {str(exc).splitlines()[0]}") from None
    if not isinstance(data, dict):
        raise TunekitError(f"{path}: expected a mapping of settings at the top level")
    check_keys([k for k in data if not (fleet and k == "models")], where=path)
    return data
