"""Every ``-r`` the project sets lists failures and errors in the final summary, not only skips: after a run with
80 failures, ``-rs`` alone leaves the user digging through thousands of lines for their ids (issue 28.2)."""

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# where the project sets -r: pytest's ini, the CI script and the GPU figures' run, sensitivity's runs, the README and docs
PLACES = [".ci/run", "ci/h200_figures.sh", "ci/gpu_lane.sh", "pytest_kvcm/sensitivity.py", "README.md",
          *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md"))]
R_FLAG = re.compile(r"""(?<![\w-])-r([a-zA-Z]+)\b""")


def _shows_failures(chars: str) -> bool:
    return "a" in chars or "A" in chars or {"f", "E"} <= set(chars)


def test_addopts_summary_lists_failures_and_errors():
    addopts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]["addopts"]
    flags = R_FLAG.findall(addopts)
    assert flags and all(_shows_failures(c) for c in flags), f"pyproject addopts {addopts!r}"


def test_every_r_flag_the_project_sets_lists_failures():
    bad = []
    for rel in PLACES:
        for n, line in enumerate((ROOT / rel).read_text().splitlines(), 1):
            bad += [f"{rel}:{n}: -r{c}" for c in R_FLAG.findall(line) if c not in ("f",) and not _shows_failures(c)]
    assert not bad, "a -r without failures and errors: " + "; ".join(bad)
