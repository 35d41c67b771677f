import os
import subprocess
import sys

import pytest

os.environ.setdefault("RAY_AUTH_MODE", "disabled")


def has_gpu() -> bool:
    from tunekit.shares.mps import gpu_present

    return gpu_present()


def pytest_collection_modifyitems(config, items):
    if has_gpu():
        return
    skip = pytest.mark.skip(reason="no NVIDIA GPU on this machine")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def run_cli(*args, timeout=900):
    """Run the real `tunekit` command as a user would (a subprocess)."""
    return subprocess.run([sys.executable, "-m", "tunekit.cli", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture(scope="session")
def example_model(tmp_path_factory):
    from tunekit.models.examples import save_example

    return save_example("tiny_cnn", str(tmp_path_factory.mktemp("models") / "tiny_cnn.onnx"))
