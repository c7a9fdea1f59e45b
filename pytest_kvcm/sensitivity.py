"""``kvcm sensitivity``: prove the suites can fail.

Runs the lane once clean and once per registered defect (``--kvcm-inject``), each in its own pytest process,
and prints defect -> the tests that caught it. Exits non-zero when the clean run fails or any defect goes
uncaught: a suite that cannot see a historic defect come back is not guarding against it.
"""

from __future__ import annotations

import json
import shlex
import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from .loading import plugin_args


def failed_tests(junit_path: Path) -> tuple[int, list[str]]:
    """(tests run, ids of failed or errored tests) from a JUnit XML report."""
    if not junit_path.exists():
        return 0, []
    root = ET.parse(junit_path).getroot()
    total, failed = 0, []
    for case in root.iter("testcase"):
        total += 1
        if case.find("failure") is not None or case.find("error") is not None:
            failed.append(f"{case.get('classname', '')}::{case.get('name', '')}")
    return total, failed


def registered_defects() -> dict[str, str]:
    """Ask pytest itself, so defects registered by users' plugins and conftest files count too."""
    proc = subprocess.run([sys.executable, "-m", "pytest", *plugin_args(), "--kvcm-list-defects", "-q"], capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"kvcm sensitivity: pytest --kvcm-list-defects failed:\n{proc.stdout}{proc.stderr}")
    out = {}
    for line in proc.stdout.splitlines():
        name, sep, story = line.partition(": ")
        if sep and " " not in name:
            out[name] = story
    return out


def run_lane(lane: str, defect: str | None, extra: list[str], workdir: Path) -> dict:
    junit = workdir / f"{defect or 'clean'}.xml"
    cmd = [sys.executable, "-m", "pytest", *plugin_args(), f"--kvcm-lane={lane}", "--kvcm-version=both", "-q", "-p", "no:randomly",
           f"--junitxml={junit}", *extra]
    if defect:
        cmd.append(f"--kvcm-inject={defect}")
    start = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    total, failed = failed_tests(junit)
    return {"defect": defect, "returncode": proc.returncode, "tests": total, "caught_by": failed,
            "seconds": round(time.monotonic() - start, 1), "tail": proc.stdout[-3000:] + proc.stderr[-2000:]}


class Progress:
    """One line per finished run on stderr (a tqdm bar on a terminal): a lane run takes minutes, CI logs too."""

    def __init__(self, total: int, lane: str):
        self.total, self.count, self.bar = total, 0, None
        if sys.stderr.isatty():
            try:
                from tqdm import tqdm

                self.bar = tqdm(total=total, desc=f"sensitivity {lane}", unit="run", file=sys.stderr)
            except ImportError:  # progress is a nicety, never a requirement
                pass
        self._say(f"sensitivity: {total} runs of lane {lane} (clean, then one per defect), one at a time")

    def _say(self, line: str) -> None:
        if self.bar is not None:
            self.bar.write(line, file=sys.stderr)
        else:
            print(line, file=sys.stderr, flush=True)

    def done(self, run: dict) -> dict:
        self.count += 1
        what = run["defect"] or "clean run"
        result = f"{len(run['caught_by'])} failed" if run["caught_by"] else "nothing failed"
        self._say(f"[{self.count}/{self.total}] {what}: {run['tests']} tests, {result} ({run['seconds']} s)")
        if self.bar is not None:
            self.bar.update(1)
        return run

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self.bar is not None:
            self.bar.close()


def main(args) -> int:
    registry = registered_defects()
    names = args.defect or list(registry)
    unknown = [n for n in names if n not in registry]
    if unknown:
        print(f"kvcm sensitivity: unknown defect(s) {', '.join(unknown)}; registered: {', '.join(registry)}")
        return 2
    extra = shlex.split(args.pytest_args) if args.pytest_args else []
    jobs = int(os.environ.get("KVCM_SENSITIVITY_JOBS", "1"))
    with tempfile.TemporaryDirectory(prefix="kvcm-sensitivity-") as tmp:
        with ThreadPoolExecutor(max_workers=jobs) as pool, Progress(1 + len(names), args.lane) as progress:
            runs = list(pool.map(lambda d: progress.done(run_lane(args.lane, d, extra, Path(tmp))), [None, *names]))
    clean, defects = runs[0], runs[1:]
    ok = clean["returncode"] == 0 and not clean["caught_by"]
    print(f"clean run of lane {args.lane}: {clean['tests']} tests, {len(clean['caught_by'])} failed, "
          f"exit {clean['returncode']} ({clean['seconds']} s)")
    if not ok:
        print(clean["tail"])
    print("\ndefect: what it was\n    the tests that caught it")
    for run in defects:
        caught = run["caught_by"]
        ok &= bool(caught)
        story = registry[run["defect"]]
        verdict = f"caught by {len(caught)} test(s)" if caught else "UNCAUGHT"
        print(f"\n{run['defect']} ({verdict}, {run['seconds']} s): {story}")
        for test in caught:
            print(f"    {test}")
        if not caught:
            print(f"    no test failed (exit {run['returncode']}, {run['tests']} tests ran)")
    if args.json:
        Path(args.json).write_text(json.dumps({"clean": clean, "defects": defects}, indent=2))
    print("\nsensitivity: " + ("every defect caught" if ok else "FAILED: a defect went uncaught or the clean run failed"))
    return 0 if ok else 1
