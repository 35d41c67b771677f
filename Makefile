# Two commands on a fresh machine:  `make demo` (main job, CPU share, example model)  and  `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup demo test test-unit test-gpu bench clean

# torch is optional: the CPU build goes into its own folder, which only the tests of the torch path
# see (tests/conftest.py). In the venv, `import tvm` would import it in every server and worker.
# `+cpu` matches only the CPU wheel (never PyPI's CUDA build); without it those tests are skipped.
TORCH_SITE := .torchsite
# NVRTC without a GPU: tests/test_cuda_compile.py compiles CUDA sources with it. Kept out of the venv,
# where cuda-bindings would make a CPU machine look ready for --gpu-pct (the `gpu` extra's check).
NVRTC_SITE := .nvrtcsite
# Triton (kernels.triton_gemm compiles GEMM tasks with it, for a GPU architecture, on any machine): optional likewise.
TRITON_SITE := .tritonsite

# The four installs run side by side (disjoint folders); the optional three may fail, and their tests then skip.
$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q --target $(TORCH_SITE) 'torch==2.13.0+cpu' & \
	$(BIN)/pip install -q --target $(NVRTC_SITE) 'cuda-bindings>=13,<14' 'nvidia-cuda-nvrtc>=13,<14' & \
	$(BIN)/pip install -q --no-deps --target $(TRITON_SITE) 'triton==3.6.0' & \
	$(BIN)/pip install -q -e '.[test]'; status=$$?; wait; exit $$status
	touch $(STAMP)

setup: $(STAMP)

demo: $(STAMP)
	$(BIN)/tunekit example --out examples/tiny_cnn.onnx
	$(BIN)/tunekit tune examples/tiny_cnn.onnx --cpu-pct 50 --trials 32 --resume  # a re-run adds 32 trials

# the Ray tests alone (beside the others they took 3.5 times as long: benchmarks/RESULTS.md), then the rest on two workers, where a
# module's tests stay on one (tests/conftest.py); both run, and either failing fails
test: $(STAMP)
	status=0; \
	RAY_AUTH_MODE=disabled $(BIN)/python -m pytest -q -m "ray and not gpu" tests || status=$$?; \
	RAY_AUTH_MODE=disabled $(BIN)/python -m pytest -q -n 2 --dist loadgroup -m "not gpu and not ray" tests || status=$$?; \
	exit $$status

# the fast lane (about 2 minutes): every test but the gpu and e2e ones (pyproject.toml says what e2e is)
test-unit: $(STAMP)
	RAY_AUTH_MODE=disabled $(BIN)/python -m pytest -q -m "not gpu and not e2e" tests

test-gpu: $(STAMP)
	$(BIN)/python -m pytest -q --durations=15 -m gpu tests

ZOO := tunekit-out/zoo
# stock MetaSchedule vs tunekit; then the zoo's compact copies: `tunekit check` on all, a short CPU tune of the small
bench: $(STAMP)
	$(BIN)/python benchmarks/tuning_time.py
	$(BIN)/python benchmarks/fleet.py --share cpu50 --budget 180
	mkdir -p $(ZOO)/compact && cp tests/data/zoo/*.onnx.xz $(ZOO)/compact/
	$(BIN)/python benchmarks/zoo.py check --work $(ZOO) --compact --gpu-arch sm_90
	$(BIN)/python benchmarks/zoo.py cpu-tune --work $(ZOO) --compact
	$(BIN)/python benchmarks/zoo.py table --work $(ZOO) --out $(ZOO)/zoo.md

clean:
	rm -rf tunekit-out .pytest_cache $(TORCH_SITE) $(NVRTC_SITE) $(TRITON_SITE)
