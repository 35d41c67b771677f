"""Shared fixtures. The harness itself (fleets, kernels, record readers, the `tunekit` subprocess) is
tunekit.testing: tests import it from there."""
import os
import sys

import pytest

os.environ.setdefault("RAY_AUTH_MODE", "disabled")

# torch is optional: `make test` installs the CPU build into .torchsite (not the venv, where `import
# tvm` would import it in every server and worker). Appended, so the venv's own packages win; only
# this test process sees it, not the processes it starts.
_TORCH_SITE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), ".torchsite")
if os.path.isdir(_TORCH_SITE):
    sys.path.append(_TORCH_SITE)
# Triton likewise (.tritonsite): the GEMM kernels of kernels.triton_gemm compile with it, no GPU needed
_TRITON_SITE = os.path.join(os.path.dirname(_TORCH_SITE), ".tritonsite")
if os.path.isdir(_TRITON_SITE):
    sys.path.append(_TRITON_SITE)


def has_gpu() -> bool:
    from tunekit.shares.mps import gpu_present

    return gpu_present()


# The modules that start Ray clusters are marked `ray`: `make test` runs them alone first, then the rest on two
# workers (pytest -n 2 --dist loadgroup), where a module's tests share a worker (its module fixtures run once).
_RAY_MODULES = {"test_coordinator", "test_faults_ray", "test_fleet", "test_task_fallback"}


def _group(item) -> str:
    module = item.module.__name__.rpartition(".")[2]
    return "ray" if module in _RAY_MODULES else module


@pytest.hookimpl(tryfirst=True)  # xdist reads the groups in its own hook
def pytest_collection_modifyitems(config, items):
    items.sort(key=lambda item: _group(item) != "ray")  # stable: the order within a group is kept
    for item in items:
        item.add_marker(pytest.mark.xdist_group(_group(item)))
        if _group(item) == "ray":
            item.add_marker(pytest.mark.ray)
    if has_gpu():
        return
    skip = pytest.mark.skip(reason="no NVIDIA GPU on this machine")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True, scope="session")
def _private_runtime_dir(tmp_path_factory):
    """Every share session books its share in a machine-wide ledger (shares/ledger.py): the tests get
    a ledger of their own, so that other tunekit jobs on this machine neither refuse nor are refused."""
    os.environ["TUNEKIT_RUNTIME_DIR"] = str(tmp_path_factory.mktemp("tunekit-runtime"))


@pytest.fixture(scope="session")
def example_model(tmp_path_factory):
    from tunekit.models.examples import save_example

    return save_example("tiny_cnn", str(tmp_path_factory.mktemp("models") / "tiny_cnn.onnx"))
