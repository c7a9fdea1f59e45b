"""The GPU scripts write logs of fixed names (``lane-1.log``, ``throughput.log``, ...) into ``OUT``: a folder
holding files they did not write is refused with one line before anything runs, so a user's own ``lane-1.log``
(or a checkout, the old default ``.``) is never written over; an empty or absent folder is taken and stamped,
and a folder they stamped is theirs again on the next stage."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = [("gpu_lane.sh", ["smoke"]), ("h200_figures.sh", ["kernels"])]   # parts that need no staged model first


def _run(script: str, args: list[str], out: Path, unset: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    env = {**{k: v for k, v in os.environ.items() if k not in unset}, "OUT": str(out)}
    return subprocess.run(["bash", str(ROOT / "ci" / script), *args], env=env, capture_output=True, text=True,
                          timeout=60, cwd=ROOT)


@pytest.mark.parametrize("script, args", SCRIPTS)
def test_a_folder_with_the_users_files_is_refused_untouched(tmp_path, script, args):
    out = tmp_path / "results"
    out.mkdir()
    (out / "lane-1.log").write_text("my own notes")
    (out / "throughput.log").write_text("my own figures")
    proc = _run(script, args, out)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.count("\n") == 1 and f"{script} (OUT): {out} holds files" in proc.stderr, proc.stderr
    assert proc.stdout == ""   # refused before torch was even asked for the GPU
    assert sorted(p.name for p in out.iterdir()) == ["lane-1.log", "throughput.log"]
    assert (out / "lane-1.log").read_text() == "my own notes"


def test_an_absent_folder_is_made_and_stamped(tmp_path):
    """(gpu_lane.sh alone: with no GPU it stops right after taking the folder; h200_figures.sh would go on to
    run its CPU-capable parts.)"""
    script, args = SCRIPTS[0]
    out = tmp_path / "new" / "out"
    proc = _run(script, args, out)
    assert "holds files" not in proc.stderr
    assert (out / ".kvcm-made-by").read_text().strip() == f"{script} (OUT)"
    again = _run(script, args, out)   # its own folder: taken again (the next stage writes beside the last)
    assert "holds files" not in again.stderr


def test_the_figures_lane_part_names_a_stage_the_lane_runs(tmp_path):
    """``h200_figures.sh lane`` hands ``gpu_lane.sh`` its stage: when the lane's stages were renamed (three numbered
    ones became ``smoke`` and ``models``) the figures script kept asking for stage 1, which the lane refuses."""
    text = (ROOT / "ci" / "h200_figures.sh").read_text()
    stage = re.search(r'gpu_lane\.sh "\$\{LANE_STAGE:-(\w+)\}"', text).group(1)
    proc = _run("gpu_lane.sh", [stage], tmp_path / "o", unset=("KVCM_SMOLLM2_GGUF",))   # never a staged model run
    assert "unknown stage" not in proc.stderr, proc.stderr
    assert proc.returncode != 0   # here: no staged SmolLM2 (models) or no GPU (smoke), said in one line
