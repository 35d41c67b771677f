"""Config dataclasses. YAML files in configs/ map onto TuneConfig; CLI flags override them."""
from __future__ import annotations

import dataclasses
import os
import re
from dataclasses import dataclass, field

from .errors import TunekitError


@dataclass
class TuneConfig:
    """Every setting of a tuning run. Flat on purpose: each key is one YAML key and (mostly) one CLI
    flag, so `--config` files and flags map 1:1 (flag > YAML > default). Grouped by concern below."""

    # ---- the run
    trials: int = 64                 # total measured candidates over all tasks
    seed: int = 0
    input_shapes: dict[str, list[int]] = field(default_factory=dict)
    resume: bool = False             # continue the records already in --out (same model/target/share only)
    engine: str = "tunekit"          # "tunekit" (fast loop) or "stock" (ms.tune_tasks + LocalBuilder + RPCRunner)
    precision: str = "auto"          # auto: fp16 (+NHWC, fp32 accumulation) on tensor-core GPUs, fp32 on CPU
    # Refuse an artifact whose outputs differ from onnxruntime's fp32 by more than this (max abs error
    # over the reference's largest magnitude); None: the precision's bound (tunekit.numerics.BOUNDS).
    max_output_error: float | None = None
    # ... or whose cosine similarity to onnxruntime's fp32 is below this; None: the precision's bound
    # (0.999 for fp16, 0.99999 for fp32). 0.9999 was fp16's bound until 26 Nov 2026.
    min_output_cosine: float | None = None
    # ---- several shares (--gpu-pct 20,40,100) in one process: one search, each candidate built once
    # and measured at every share (clients.multi_share); search_per_share: one search per share, as
    # before, for comparison. robust: also the share-robust artifact (run.robust).
    search_per_share: bool = False
    robust: bool = False
    # ---- search
    # The shared memory per block a GPU search lets candidates use (targets.search_target): static (48 KB)
    # or opt-in (the architecture's most, e.g. 227 KB on an H100). Experimental: not yet measured on a GPU.
    gpu_shared_memory: str = "static"
    trials_per_iter: int = 8         # candidates per build/measure batch (small: every task gets a turn early)
    builder_workers: int | None = None  # default: the cores this process may use
    build_timeout_s: float = 120.0
    overlap: bool | str = "auto"     # build batch N+1 while N is measured; auto: GPU, or CPU with spare cores
    # Batches in flight when overlapping (None: 4 on CUDA, 2 on CPU). With 2, the build pool idled whenever both
    # batches waited for their measurement or the loop searched: on the H100, fp16 ResNet-18 at 1,024 trials, 4 took
    # the loop's wait for batches from 0.165 to 0.065 s a trial and the run from 0.420 to 0.285 s a trial, with the
    # same tuned latency (benchmarks/results/h100-pipeline-depth). CPU overlap keeps 2: not measured there.
    pipeline_depth: int | None = None
    # A task with a batch in flight may send its next batch from what its last search picked (its reserve;
    # no search, which must wait to hear the batch's results), when no other task can take the slot. Without
    # it a client holding fewer tasks than pipeline_depth cannot fill its pipeline: on 2 H100s, three of
    # four ResNet-18 clients held 3-4 tasks each and waited on their batches 0.15 s a trial, against 0.08
    # on 1 GPU with 7-14 tasks per client (benchmarks/results/h200x2-resnet18-gpu40-coordinator-768).
    reserve_ahead: bool = True
    # A busy task with picks in reserve may also draw from the shared trial pool (coordinator clients), when no
    # idle task still improves (clients.scheduler). Off: measured with search_in_background in lease 17, the two
    # together drained the pool early and the clients ended far apart (see the scheduler).
    reserve_from_pool: bool = False
    # Search on a thread of its own when overlapping: while one task is searched, the loop keeps sending the other
    # tasks' batches from their reserves and collecting what comes back. The records of batches collected during a
    # search are committed right after it (TVM's JSONDatabase is not safe to write while a search reads it), so a
    # crash in a search may lose those batches' records as well as those in flight. Off by default: on 2 H100s
    # (lease 17 of benchmarks/results/h200x2-resnet18-gpu40-coordinator-768) the loop still waited on the search
    # for 90-93% of the search's time (a client's search was busy 60-80% of the client's time, and its other tasks had
    # little in reserve to send meanwhile), and the same number of searches took 232-257 s per run against
    # 181-208 in leases 12 and 15. 1 GPU 4.50 and 2 GPUs 7.14 trials/s (1.59x), against 5.31 and 8.95 (1.69x)
    # with it off in lease 15, on another VM.
    search_in_background: bool = False
    measure_untuned_tasks: bool = True  # one baseline measurement per task (report: untuned_us per task)
    # Which task gets the next batch (clients.scheduler): "gradient" (warm-up round, then Ansor's
    # gradient; tasks under min_task_share of the model's untuned weight x latency are not tuned) or
    # "score" (the rule before it: weight x latency x 0.5^stale batches), kept for comparison.
    task_scheduler: str = "gradient"
    min_task_share: float = 0.005
    time_budget_s: float | None = None  # stop launching batches after this many seconds of tuning
    async_cost_model: bool = True    # train the cost model on its own thread, overlapping the loop
    # Warm start (clients.warm_start): tune out dirs / record dirs whose best records per task are
    # measured again at this share before the search; their cost model is loaded when none is here.
    warm_start: list[str] = field(default_factory=list)
    warm_start_top_k: int = 2       # per task: the best records re-measured here (each costs a trial)
    # ---- measurement
    servers: int = 1                 # runner servers at the share
    server_mode: str = "warm"        # "warm" (tunekit) or "stock" (tvm.exec.rpc_server)
    session_timeout_s: float = 120.0
    allow_unenforced_share: bool = False  # GPU without MPS: loudly labelled in the report
    # ---- other jobs on this machine (shares.ledger): each job books pct x servers of its device;
    # past 100% it is refused, unless it may wait up to share_wait_s for others to leave, or oversubscribe.
    oversubscribe: bool = False
    share_wait_s: float = 0.0
    # One measurement at a time per device (shares.measure_lock): "auto" = on a GPU only (servers there
    # share memory bandwidth and L2; CPU shares have disjoint cores), true, false.
    measure_lock: bool | str = "auto"
    measure_repeats: int = 20        # latency repeats for before/after numbers
    stock_runner: str = "auto"      # engine=stock only: "rpc", "local", or auto (local on GPU, rpc on CPU)
    min_repeat_ms: int = 20          # time evaluator: minimum time per measurement
    # ---- evolutionary search. MetaSchedule's defaults (population 512, 4 generations, 50 valid random
    # samples first) cost the same per batch whatever the batch size: on 2 cores, 87% of a 32-trial
    # CPU run was search, and on the H100 search was 55% of the wall. Population None = 8 x
    # trials_per_iter within 128..512. Generations and valid samples None = by target:
    # - CUDA: 2 and max(16, trials_per_iter) (<= 50). ~97% of random ResNet-18 conv schedules fail
    #   VerifyGPUCode, so collecting 50 valid ones took ~6 rounds of the population: a conv batch of
    #   16 now searches in 8-13 s instead of 30-38 s (2 cores, benchmarks/search_cost.py), and on the H100 search fell from
    #   0.77 to 0.26 s/trial with a faster tuned model (benchmarks/results/h100-resnet18-gpu40-tuning-time).
    # - CPU: 3 and 50. Sampling rarely fails there, and 2 generations gave slower tuned models
    #   on the 2-core machine (0.77 and 1.21 ms against 0.64 ms for tiny_cnn at cpu50, 32 trials).
    # - One search serves several batches (search_batches; None = 4 on CUDA, 1 on CPU): it picks
    #   search_batches x trials_per_iter candidates, the task's batch takes the best-predicted
    #   trials_per_iter and its next batches take the rest before the task is searched again. A
    #   search costs about the same whatever it picks (H100, fp16 ResNet-18 tuned 256 trials at 40%:
    #   10.3 s per search of 16, 13.0 s of 32), and the search set the pace of the run
    #   (benchmarks/results/h100-resnet18-search-per-trial). The scheduler still hands out batches of
    #   trials_per_iter, so every task gets its turn as early as before.
    # - A task's first search only samples and ranks (search_first_look): no generations before the
    #   task has a measurement to steer them (clients.first_look). fp16 ResNet-18 on the H100, 256
    #   trials: 0.507 vs 0.728 s per trial, tuned 0.592 vs 0.680 ms (benchmarks/results/h100-first-look);
    #   2-core CPU, 32 trials at cpu50: tuning wall 1.2-2.8x shorter, tuned models within +-3%.
    search_population: int | None = None
    search_genetic_iters: int | None = None
    search_init_samples: int | None = None
    search_batches: int | None = None
    search_first_look: bool = True
    # ---- fleet, faults and security (README "Security"): no runner server of the share reachable for this long
    # (restarts keep failing) stops the run with a clear error, keeping every measured trial.
    servers_gone_timeout_s: float = 120.0
    listen_host: str = "127.0.0.1"   # tracker + runner servers; not loopback: needs a shared secret
    rpc_secret_file: str | None = None  # shared secret (first line); else env TUNEKIT_RPC_SECRET

    def with_trials(self, trials: int | None) -> "TuneConfig":
        """This config with `trials` replaced (None keeps it): the API's `trials=` argument."""
        return self if trials is None else dataclasses.replace(self, trials=trials)

    @property
    def population(self) -> int:
        if self.search_population is not None:
            return self.search_population
        return min(512, max(128, 8 * self.trials_per_iter))

    def genetic_iters_for(self, target_kind: str) -> int:
        if self.search_genetic_iters is not None:
            return self.search_genetic_iters
        return 2 if target_kind == "cuda" else 3

    def search_batches_for(self, target_kind: str) -> int:
        if self.search_batches is not None:
            return self.search_batches
        return 4 if target_kind == "cuda" else 1

    def pipeline_depth_for(self, target_kind: str) -> int:
        if self.pipeline_depth is not None:
            return self.pipeline_depth
        return 4 if target_kind == "cuda" else 2

    def init_samples_for(self, target_kind: str) -> int:
        if self.search_init_samples is not None:
            return self.search_init_samples
        return min(50, max(16, self.trials_per_iter)) if target_kind == "cuda" else 50

    def __post_init__(self):
        for name in ("trials", "trials_per_iter", "servers", "measure_repeats", "warm_start_top_k", "search_population",
                     "search_genetic_iters", "search_init_samples", "search_batches", "min_repeat_ms", "pipeline_depth"):
            value = getattr(self, name)
            if value is None and name in ("search_population", "search_genetic_iters", "search_init_samples",
                                          "search_batches", "pipeline_depth"):
                continue
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise TunekitError(f"{name} must be a positive integer, got {value!r}")
        if not isinstance(self.min_task_share, (int, float)) or isinstance(self.min_task_share, bool) \
                or not 0 <= self.min_task_share < 1:
            raise TunekitError(f"min_task_share must be a fraction in [0, 1), got {self.min_task_share!r}")
        if self.time_budget_s is not None and (not isinstance(self.time_budget_s, (int, float))
                                               or isinstance(self.time_budget_s, bool) or self.time_budget_s <= 0):
            raise TunekitError(f"--time-budget must be a positive number of seconds, got {self.time_budget_s!r}")
        if (not isinstance(self.servers_gone_timeout_s, (int, float)) or isinstance(self.servers_gone_timeout_s, bool)
                or not self.servers_gone_timeout_s > 0):
            raise TunekitError(f"servers_gone_timeout_s must be a positive number of seconds, "
                               f"got {self.servers_gone_timeout_s!r}")
        if not isinstance(self.listen_host, str) or not self.listen_host.strip():
            raise TunekitError(f"listen_host must be a host address, got {self.listen_host!r}")
        if not isinstance(self.warm_start, list) or not all(isinstance(d, str) for d in self.warm_start):
            raise TunekitError(f"warm_start must be a list of directories, got {self.warm_start!r}")
        if self.max_output_error is not None and (not isinstance(self.max_output_error, (int, float))
                                                  or isinstance(self.max_output_error, bool)
                                                  or not self.max_output_error > 0):
            raise TunekitError(f"max_output_error must be a positive number, got {self.max_output_error!r}")
        if self.min_output_cosine is not None and (not isinstance(self.min_output_cosine, (int, float))
                                                   or isinstance(self.min_output_cosine, bool)
                                                   or not 0 < self.min_output_cosine <= 1):
            raise TunekitError(f"min_output_cosine must be a number in (0, 1], got {self.min_output_cosine!r}")
        for name in ("search_per_share", "robust", "search_first_look", "reserve_ahead", "reserve_from_pool",
                     "search_in_background"):
            if not isinstance(getattr(self, name), bool):
                raise TunekitError(f"{name} must be true or false, not {getattr(self, name)!r}")
        if self.robust and self.search_per_share:
            raise TunekitError("--robust needs every candidate measured at every share: drop --search-per-share")
        if self.task_scheduler not in ("gradient", "score"):
            raise TunekitError(f"task_scheduler must be gradient or score, not {self.task_scheduler!r}")
        if self.gpu_shared_memory not in ("static", "opt-in"):
            raise TunekitError(f"gpu_shared_memory must be static or opt-in, not {self.gpu_shared_memory!r}")
        if self.precision not in ("auto", "fp32", "fp16"):
            raise TunekitError(f"precision must be auto, fp32 or fp16, not {self.precision!r}")
        if self.engine not in ("tunekit", "stock"):
            raise TunekitError(f"engine must be 'tunekit' or 'stock', not {self.engine!r}")
        if self.stock_runner not in ("auto", "rpc", "local"):
            raise TunekitError(f"stock_runner must be auto, rpc or local, not {self.stock_runner!r}")
        if self.overlap not in (True, False, "auto"):
            raise TunekitError(f"overlap must be true, false or auto, not {self.overlap!r}")
        if self.measure_lock not in (True, False, "auto"):
            raise TunekitError(f"measure_lock must be true, false or auto, not {self.measure_lock!r}")
        if not isinstance(self.oversubscribe, bool):
            raise TunekitError(f"oversubscribe must be true or false, not {self.oversubscribe!r}")
        if (not isinstance(self.share_wait_s, (int, float)) or isinstance(self.share_wait_s, bool)
                or not self.share_wait_s >= 0):
            raise TunekitError(f"--wait-for-share must be a number of seconds >= 0, got {self.share_wait_s!r}")
        if self.server_mode not in ("warm", "stock"):
            raise TunekitError(f"server_mode must be 'warm' or 'stock', not {self.server_mode!r}")


CLIENT_CORES = ("shared", "per-gpu", "split")


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
    # The cores of the clients on one node: "shared" (each client's search and build workers may run on
    # any of the node's cores; its thread and worker counts are its part of them) or "split" (each client
    # pinned to a disjoint slice). Measured on 2 x H200 (ResNet-18 at 40%, two leases): split kept the
    # clients from slowing each other as they grew in number (2 GPUs / 1 GPU 1.68x against 1.49x), but
    # it did so by slowing the 1-GPU run more (4.13 trials/s against 5.47: a client no longer used the
    # cores another left idle), and 2 GPUs did fewer trials/s (6.92 against 8.14); so shared by default
    # (benchmarks/results/h200x2-resnet18-gpu40-coordinator-768). "per-gpu": a node's cores split evenly over
    # the GPUs measured on there, each part shared by a group of the node's clients, as if every GPU came with
    # a machine of its own (on a node with one GPU, or none, the same as shared); measured on 2 x H200 in one
    # lease: 1.54x against shared's 1.58x, so not the default.
    client_cores: str = "shared"

    def __post_init__(self):
        if not isinstance(self.clients, int) or isinstance(self.clients, bool) or self.clients < 1:
            raise TunekitError(f"--clients must be a positive integer, got {self.clients!r}")
        if not isinstance(self.client_nodes, str) or not re.fullmatch(r"[A-Za-z0-9_.:/-]+", self.client_nodes):
            raise TunekitError(f"--client-nodes must be any, cpu-only or a Ray custom resource name such as "
                               f"tunekit_client, got {self.client_nodes!r}")
        if self.client_cores not in CLIENT_CORES:
            raise TunekitError(f"--client-cores must be one of {', '.join(CLIENT_CORES)}, got {self.client_cores!r}")
        if self.client_nodes in ("CPU", "GPU", "memory", "object_store_memory"):
            raise TunekitError(f"--client-nodes {self.client_nodes}: name a custom resource that only client "
                               "nodes advertise (e.g. tunekit_client), or use cpu-only")


def load_yaml_config(path: str) -> dict:
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
    known = {f.name for f in dataclasses.fields(TuneConfig)} | {"gpu_pct", "cpu_pct", "out"}
    unknown = sorted(set(data) - known)
    if unknown:
        raise TunekitError(f"{path}: unknown key(s) {unknown}; known keys: {sorted(known)}")
    return data
