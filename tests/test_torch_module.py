"""Tuning a PyTorch module (torch.export -> Relax) and calling the result with torch tensors. Runs
where torch is installed (`make test` puts a CPU build in .torchsite); skipped otherwise."""
import os
import subprocess
import sys

import pytest

import tunekit
from tunekit import TuneConfig, TunekitError
from tunekit.testing import QUICK_SEARCH


def _small_module(torch, seed: int):
    torch.manual_seed(seed)

    class Small(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
            self.fc = torch.nn.Linear(8, 4)

        def forward(self, x):
            return self.fc(torch.relu(self.conv(x)).mean(dim=(2, 3)))

    return Small().eval()


@pytest.mark.e2e
def test_tune_a_torch_module_and_call_the_result_with_torch_tensors(tmp_path):
    torch = pytest.importorskip("torch")
    module, x = _small_module(torch, 0), torch.randn(1, 3, 16, 16)
    out = str(tmp_path / "small")
    result = tunekit.tune(module, example_inputs=(x,), cpu_pct=50, out=out,
                          config=TuneConfig(trials=4, trials_per_iter=4, measure_repeats=5, search=dict(QUICK_SEARCH)))
    assert os.path.basename(result.artifact) == "small-cpu50.so" and result.trials == 4
    numerics = result.report["numerics"]["tuned"]
    assert numerics[0]["cosine"] > 0.9999  # against the module itself, run eagerly
    model = tunekit.load(result.artifact)
    y = model(x)
    assert isinstance(y, torch.Tensor)
    with torch.no_grad():
        torch.testing.assert_close(y, module(x), rtol=1e-4, atol=1e-5)
    # --resume checks the module (class, weights, input shapes): other weights are another model
    with pytest.raises(TunekitError, match="another model"):
        tunekit.tune(_small_module(torch, 1), example_inputs=(x,), cpu_pct=50, out=out,
                     config=TuneConfig(trials=4, resume=True))


def test_what_is_not_a_model_is_refused_in_one_line(tmp_path):
    with pytest.raises(TunekitError, match="ONNX file path or a torch.nn.Module"):
        tunekit.tune(object(), cpu_pct=50, out=str(tmp_path / "o"))


def test_without_torch_the_module_path_names_the_extra():
    code = ("import sys; sys.modules['torch'] = None\n"
            "from tunekit.frontend.torch_loader import import_module\n"
            "from tunekit.errors import TunekitError\n"
            "try:\n    import_module(object(), ())\nexcept TunekitError as exc:\n    print(exc)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert "pip install 'tunekit[torch]'" in proc.stdout, proc.stdout + proc.stderr
