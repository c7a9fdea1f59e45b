"""The GPU scripts write logs of fixed names (``lane-1.log``, ``throughput.log``, ...) into ``OUT``: a folder
holding files they did not write is refused with one line before anything runs, so a user's own ``lane-1.log``
(or a checkout, the old default ``.``) is never written over; an empty or absent folder is taken and stamped,
and a folder they stamped is theirs again on the next stage."""

from __future__ import annotations

import os
import re
import subprocess
import sys
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


def test_the_figures_gate_runs_select_their_tests():
    """Each pytest run of ``h200_figures.sh`` (the reuse and Gemma 3 gates) selects tests: those files are marked
    post_merge, and a run without ``--kvcm-stage=post_merge`` deselected all twelve reuse gates on an H100
    (2026-12-08: "12 deselected"), so the part reported nothing and passed."""
    text = (ROOT / "ci" / "h200_figures.sh").read_text().replace("\\\n", " ")
    runs = re.findall(r"python3 -m pytest (.*?) -q", text)
    assert len(runs) >= 2, runs
    for run in runs:
        proc = subprocess.run([sys.executable, "-m", "pytest", *run.split(), "--collect-only", "-q", "-p", "no:cacheprovider"],
                              capture_output=True, text=True, timeout=120, cwd=ROOT)
        summary = proc.stdout.strip().splitlines()[-1]
        assert re.match(r"[1-9]\d*(/\d+)? tests? collected", summary), (run, summary)


def test_the_lane_reaches_pytest_on_a_machine_that_reports_a_gpu(tmp_path):
    """Past the GPU check nothing ran here (this machine has none), so three faults met first on an H100: ``$2``
    read bare under ``set -u`` when no K/N part is given ("2: unbound variable"), pytest's rootdir taken from the
    durations path when OUT lies outside the checkout ("no lane file ci/l0_h100.yml"), and the split options with
    pytest-split missing. torch is told it runs on an H100 (``sitecustomize``); the lane's GPU tests are not
    selected on a CPU, so the stage ends at pytest's summary in seconds."""
    fake = tmp_path / "fake_gpu"
    fake.mkdir()
    (fake / "sitecustomize.py").write_text(
        "import torch\ntorch.cuda.get_device_name = lambda *a, **k: 'NVIDIA H100 80GB HBM3'\n")
    out = tmp_path / "outside" / "lane"
    env = {**os.environ, "OUT": str(out), "DEADLINE_S": "120", "PYTHONPATH": str(fake)}
    proc = subprocess.run(["bash", str(ROOT / "ci" / "gpu_lane.sh"), "smoke"], env=env, capture_output=True,
                          text=True, timeout=180, cwd=ROOT)
    said = proc.stdout + proc.stderr
    assert "unbound variable" not in said and "== l0_h100 pre_merge (gpu_smoke) whole" in said, said
    log = (out / "lane-smoke.log").read_text()
    assert "no lane file" not in log and "unrecognized arguments" not in log, log
    assert re.search(r"(no tests ran|passed|skipped) in [\d.]+s", log), log
    assert (out / "durations-l0_h100-pre_merge-1.json").is_file()


def test_the_device_wheels_carry_the_split_plugin_the_lane_asks_for():
    """The lane passes pytest-split's options on every run; the GPU machine has no registry, so the wheel must be
    among those ``ci/gpu_wheels.sh`` stages, at the version the test extra pins (it was not: "unrecognized
    arguments: --durations-path" on the H100)."""
    pinned = re.search(r'"pytest-split==([\d.]+)"', (ROOT / "pyproject.toml").read_text()).group(1)
    assert "--durations-path" in (ROOT / "ci" / "gpu_lane.sh").read_text()
    assert f"pytest-split=={pinned}" in (ROOT / "ci" / "gpu_wheels.sh").read_text()
