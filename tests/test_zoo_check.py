"""`tunekit check --gpu-arch sm_90` on the zoo's failure families (issue 55), with no GPU.

The models are benchmarks/zoo.py's compact copies (tests/data/zoo: torchvision, timm and transformers exports whose
weights are each one constant; the graphs are exact). Families that failed before, in three models:
- squeeze-excitation convs with no fp16 design space: efficientnet_b0 (as MobileNetV3 and RegNet: `make bench`
  checks the whole zoo);
- fp16 conversion refused: swin_t (R.Callable), maxvit_t (emit_te, and tasks with symbolic shapes).
Three more have tests of their own that cost less than a whole check: vit_b_16_dynamo's std::bad_alloc
(test_partial_half), shufflenet_v2_x1_0's channel shuffle (test_shape_folding) and mobilevit_s's two kernels of one
name (test_kernel_symbols)."""
import json
import lzma
import os

import pytest

from tunekit.testing import run_cli

pytestmark = pytest.mark.e2e

ZOO = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "zoo")
FAMILIES = ["efficientnet_b0", "swin_t", "maxvit_t"]


def zoo_model(name: str, into) -> str:
    """The compact model decompressed into `into`."""
    path = os.path.join(str(into), f"{name}.onnx")
    with lzma.open(os.path.join(ZOO, f"{name}.onnx.xz")) as src, open(path, "wb") as dst:
        dst.write(src.read())
    return path


@pytest.fixture(scope="module")
def checks(tmp_path_factory):
    """Every family's `tunekit check`, two at a time (each is one busy process: one core each)."""
    from concurrent.futures import ThreadPoolExecutor

    into = tmp_path_factory.mktemp("zoo")

    def check(name):
        return run_cli("check", zoo_model(name, into), "--gpu-arch", "sm_90", "--json", timeout=900)

    with ThreadPoolExecutor(2) as pool:
        return dict(zip(FAMILIES, pool.map(check, FAMILIES)))


@pytest.mark.parametrize("name", FAMILIES)
def test_every_failure_family_will_tune_in_fp16_on_sm_90(name, checks):
    proc = checks[name]
    assert proc.returncode in (0, 1), proc.stderr[-2000:]
    result = json.loads(proc.stdout)
    assert result["precision"] == "fp16", result["problems"]
    assert proc.returncode == 0 and not result["problems"], result["problems"]
    assert result["tasks"] and all(task["spaces"] > 0 for task in result["tasks"]), result["tasks"]
