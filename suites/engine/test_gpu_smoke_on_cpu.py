"""The GPU smoke tests (``suites/engine/gpu_smoke``, the pre-merge stage of ``ci/l0_h100.yml``) in their CPU form: the same
tests at a CPU's scale (``_smoke.CPU_SCALE``: fewer layers, short windows and chunks), the kernel tests under the
Triton interpreter and the rest on the torch attention path. Minutes on a 2-core machine: post-merge work, so
a change to a smoke test is proved here before a GPU runs it."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvcm.engine import triton_attention

SMOKE = Path(__file__).resolve().parent / "gpu_smoke"


@pytest.mark.cpu_only
@pytest.mark.post_merge
@pytest.mark.slow
@pytest.mark.parametrize("form", ["kernels_interpreted", "torch_path"])
def test_gpu_smoke_passes_on_the_cpu(form):
    env = dict(os.environ, KVCM_SMOKE_DEVICE="cpu")
    if form == "kernels_interpreted":
        if triton_attention.triton is None:
            pytest.skip("Triton is not installed (pip install triton: its interpreter runs the kernels here)")
        env["TRITON_INTERPRET"] = "1"
        target = [str(SMOKE / "test_smoke_kernels.py")]
    else:
        env.pop("TRITON_INTERPRET", None)
        target = [str(SMOKE), f"--ignore={SMOKE / 'test_smoke_kernels.py'}"]
    # the CPU form is marked post_merge: its own run is of that stage
    res = subprocess.run([sys.executable, "-m", "pytest", *target, "-q", "-p", "no:cacheprovider",
                          "--kvcm-stage=post_merge"], env=env,
                         cwd=SMOKE.parents[2], capture_output=True, text=True, timeout=1800)
    assert res.returncode == 0 and " passed" in res.stdout and " skipped" not in res.stdout, \
        res.stdout[-4000:] + res.stderr[-2000:]
