"""The explorer's lines reach the summary under pytest-xdist too (``.ci/run`` runs the suite with ``-n 2 --dist
loadfile``). The controller collects nothing, so it never loads the explorer's conftest: before the root
``conftest.py`` printed what the worker handed back, such a run reported no ``distinct states`` at all."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.post_merge
@pytest.mark.exhaustive
def test_an_xdist_run_prints_the_explorers_lines():
    pytest.importorskip("xdist")
    # the directory above the explorer's, so the controller does not load its conftest as an initial one
    cmd = [sys.executable, "-m", "pytest", "suites/managers", "-n", "2", "--dist", "loadfile", "-q", "-p",
           "no:cacheprovider", "-k", "test_explorer_finds_no_violation and v1-full-tpb2-b3",
           "--kvcm-exhaustive-scale=0.01"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    run = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    assert "exhaustive explorer" in run.stdout
    assert "v1-full-tpb2-b3-reuse_off-ids-r2: " in run.stdout and "exhaustive: 1 configurations" in run.stdout, \
        run.stdout[-3000:]
