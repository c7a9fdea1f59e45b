"""Nothing a user gives makes a command wait for ever or take time that grows with the product of two inputs.

Before, ``kvcm dashboard --results FIFO`` opened the FIFO to read its header and waited for a writer for ever
(``--kvcm-results FIFO`` opened it read-write, which does not block, and was refused); ``kvcm plan --pp 1024`` on
a 1,024-layer model built 2,048 stage caches (each a manager, an estimation cache and two warmups) and took
134 s, against 6.5 s for ``--pp 28``. Stages of one shape are now planned once (``kvcm.plan_parallel.Stages``):
the number of caches built is counted here, never timed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvcm.plan import add_arguments, plan

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "kvcm" / "configs"


@pytest.mark.parametrize("kind", ["fifo", "character_device"])
def test_dashboard_refuses_a_store_that_is_not_a_regular_file_at_once(tmp_path, kind):
    if kind == "fifo":
        store = tmp_path / "results.sqlite"
        os.mkfifo(store)
    else:
        store = Path("/dev/zero")
    env = {**os.environ, "PYTHONPATH": f"{ROOT}:{os.environ.get('PYTHONPATH', '')}"}
    proc = subprocess.run([sys.executable, "-m", "pytest_kvcm.cli", "dashboard", "--results", str(store), "--out",
                           str(tmp_path / "d.html")], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and proc.stdout == "", proc.stderr
    assert proc.stderr == (f"pytest-kvcm dashboard: results store {store}: is not a regular file (a FIFO, device or "
                           "socket); give the SQLite file's path\n")
    assert not (tmp_path / "d.html").exists()


def _args(argv: list[str]):
    import argparse

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(argv)


def _config(tmp_path: Path, layers: int, base: str = "llama-3-8b") -> str:
    cfg = json.loads((CONFIGS / f"{base}.json").read_text())
    cfg["num_hidden_layers"] = layers
    path = tmp_path / f"{base}-{layers}.json"
    path.write_text(json.dumps(cfg))
    return str(path)


@pytest.fixture
def builds(monkeypatch):
    """How many stage caches a plan builds; a plan that builds more than ``limit`` stops at once (so the code
    before, which built one per stage, fails in a second instead of minutes)."""
    import kvcm.estimation as estimation

    real = estimation.build_with_estimation
    counted = {"n": 0, "limit": 10**9}

    def counting(*args, **kwargs):
        counted["n"] += 1
        assert counted["n"] <= counted["limit"], f"built {counted['n']} stage caches"
        return real(*args, **kwargs)

    monkeypatch.setattr(estimation, "build_with_estimation", counting)
    return counted


@pytest.mark.post_merge
@pytest.mark.parametrize("pp", [1024, 1000, 7])
def test_plan_builds_one_cache_per_stage_shape_not_per_stage(tmp_path, builds, pp):
    """1,024 layers over 1,024 stages: every stage one layer of the same shape; over 1,000: 24 stages of two
    layers and 976 of one; over 7: stages of 147 and 146 layers. At most two shapes, so at most two builds a
    version (and V1's rebuild at the fewest tokens, two more)."""
    builds["limit"] = 8
    args = _args(["--model", _config(tmp_path, 1024), "--pp", str(pp)])
    out = plan(args, progress=False)
    assert builds["n"] <= 8
    for entry in out["managers"]:
        stages = entry["stages"]
        assert [s["pp_rank"] for s in stages] == list(range(pp))
        assert sum(s["num_layers"] for s in stages) == 1024
        assert [s["first_layer"] for s in stages] == [0] + [s["last_layer"] + 1 for s in stages[:-1]]


@pytest.mark.post_merge
@pytest.mark.parametrize("model, options", [
    ("gemma-3-270m", ["--pp", "4"]),            # sliding and global layers: stages of different shapes
    ("gemma-3-270m", ["--pp", "5", "--kvcm-version", "v1"]),
    ("qwen3-0.6b", ["--pp", "3", "--tp", "2"]),
    ("deepseek-v4-flash", ["--pp", "4", "-D", "1"]),  # its own ranks: planned stage by stage, as before
], ids=["gemma_pp4", "gemma_pp5_v1", "qwen_pp3_tp2", "deepseek_pp4_mtp"])
def test_sharing_a_stage_cache_changes_no_figure(monkeypatch, model, options):
    """The plan with stages of one shape shared equals the plan that builds every stage on its own."""
    args = _args(["--model", model, *options])
    shared = plan(args, progress=False)
    import kvcm.plan_parallel as plan_parallel

    monkeypatch.setattr(plan_parallel.Stages, "shape", lambda self, r: r)  # every stage its own shape
    assert plan(args, progress=False) == shared
