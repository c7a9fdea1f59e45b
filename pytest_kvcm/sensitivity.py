"""``kvcm sensitivity``: prove the suites can fail.

Every registered defect is put back (``--kvcm-inject``), each in its own pytest process, and the run must fail:
a suite that cannot see a historic defect come back is not guarding against it. Two modes:

* ``fast`` (the default, what CI runs): each defect runs only the tests it names as its ``catchers``, after one
  clean run of all of them; a defect must be caught by at least ``--min-catchers`` tests (2). A defect that
  names no catchers (a user's own, say) runs the whole lane instead. Minutes, not an hour.
* ``full``: the whole lane per defect, as a release check; it also reports tests that caught a defect without
  being named (candidates for ``catchers``) and named catchers that did not fail.

The contract suites run on the managers ``--target`` names (``--kvcm-target`` of every run); without it, on the
targets the defect names (``registry.register(..., targets=("mine",))``: a user's adapter bug is run against the
user's adapter), else on the session's (the ``kvcm_target`` ini value, else kvcm's defaults).

A catch is a failed check: a test counts as a catcher only when it *failed* (JUnit ``failure``); one that errored
(set-up, import, a worker that could not be handed the defect, a time-out) is reported as *broken* and counted
for nothing, so a defect whose catchers errored is not caught (``junit_outcomes.py``). A defect whose catchers a
declared difference of the adapter skipped or relaxed says so. Without ``--defect``, the defects whose catchers
are not here are left out with one line (the built-in catalogue's are the project's own suites, which a wheel does
not ship): a maintainer's directory runs the maintainer's own defects.

Exits non-zero when a clean run fails or errors, or any defect is caught by fewer failed tests than required.
Every input is checked before the first run (``check_inputs``): the options, ``KVCM_SENSITIVITY_JOBS`` and ``PYTEST_ADDOPTS``,
the ``--json`` path, and, in the one pytest process that lists the defects, the lane, the targets and the
``--pytest-args`` (pytest's own usage error for them). Bad input exits 2 with one line on stderr.
"""

from __future__ import annotations

import importlib.util
import json
import shlex
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from . import junit_outcomes
from .junit_outcomes import ID_PROPERTY
from .loading import plugin_args
from .paths import output_problem, write_atomically

DEFAULT_LANE = "l0_cpu"
JOBS_ENV = "KVCM_SENSITIVITY_JOBS"
# options a run must not carry: each would change what the runs count (name -> why)
REFUSED = {"--kvcm-inject": "sensitivity injects each defect itself",
           "--junitxml": "sensitivity reads its own JUnit report", "--junit-xml": "sensitivity reads its own JUnit report",
           "--kvcm-lane": "give --lane", "--kvcm-target": "give --target",
           "-x": "a run stopped at its first failure counts one catcher at most",
           "--exitfirst": "a run stopped at its first failure counts one catcher at most",
           "--maxfail": "a run stopped after some failures undercounts the catchers",
           "--collect-only": "nothing would run", "--co": "nothing would run",
           "--kvcm-list-defects": "nothing would run", "--kvcm-list-defects-json": "nothing would run",
           "-h": "nothing would run", "--help": "nothing would run", "--version": "nothing would run"}


class InputError(Exception):
    """One bad input of ``kvcm sensitivity``, found before any run; the message is the line to print."""


def _refused(arg: str) -> str | None:
    for opt, why in REFUSED.items():
        if arg == opt or opt.startswith("--") and arg.startswith(opt + "="):
            return why
    if len(arg) > 2 and arg[0] == "-" and arg[1].isalpha() and arg[1] not in "kmpocWn" and "x" in arg[1:] \
            and arg[1:].isalpha():
        return REFUSED["-x"]  # -x inside a cluster of flags (-xq)
    return None


def _split(source: str, text: str) -> list[str]:
    try:
        args = shlex.split(text)
    except ValueError as e:
        raise InputError(f"{source}={text!r}: cannot be split into arguments ({e})") from None
    for arg in args:
        why = _refused(arg)
        if why:
            raise InputError(f"{source}={text!r}: {arg} cannot be used here: {why}")
    return args


def check_inputs(args) -> tuple[list[str], int]:
    """(the extra pytest arguments, the job count), or ``InputError`` for the first bad option or variable."""
    _split("PYTEST_ADDOPTS", os.environ.get("PYTEST_ADDOPTS", ""))  # every run inherits it
    extra = _split("--pytest-args", args.pytest_args or "")
    need = getattr(args, "min_catchers", 2)
    if isinstance(need, bool) or not isinstance(need, int) or need < 1:
        raise InputError(f"--min-catchers={need!r}: must be an integer >= 1 (tests that must fail for a defect "
                         "to count as caught)")
    jobs, source = getattr(args, "jobs", None), "--jobs"
    if jobs is None:
        raw, source = os.environ.get(JOBS_ENV, "1"), JOBS_ENV
        try:
            jobs = int(raw)
        except ValueError:
            raise InputError(f"{JOBS_ENV}={raw!r}: must be an integer >= 1 (pytest runs at once)") from None
    if jobs < 1:
        raise InputError(f"{source}={jobs}: must be >= 1 (pytest runs at once)")
    if args.json:
        problem = output_problem(args.json, ours=_is_report)
        if problem:
            raise InputError(f"--json {args.json}: {problem}")
    return extra, jobs


def _is_report(path: Path) -> bool:
    """Whether ``path`` is a report an earlier ``--json`` wrote (the only file ``--json`` replaces)."""
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    return isinstance(data, dict) and {"mode", "clean", "defects"} <= set(data)


def pytest_itemcollected(item) -> None:
    """In sensitivity's own runs (``-p pytest_kvcm.sensitivity``): each test's id by its module, recorded in the
    JUnit report. JUnit's classname comes from the node id, which names the file from the rootdir: a venv inside
    the project gave ``.venv.lib.python3.11.site-packages.pytest_kvcm.contract...``, and ``--pyargs`` from outside
    the rootdir gave no module at all (``::test_x[mine]``)."""
    module = getattr(getattr(item, "module", None), "__name__", None)
    if module:
        rest = item.nodeid.split("::", 1)[1] if "::" in item.nodeid else item.name
        item.user_properties.append((ID_PROPERTY, f"{module}::{rest}"))


def registered_defects(lane: str | None = None, target: str | None = None, extra: list[str] = ()) -> dict[str, dict]:
    """Ask pytest itself, so defects registered by users' plugins and conftest files count too:
    name -> {story, upstream, catchers}. The same process checks what every run will be given (the lane, the
    targets, the extra arguments): pytest's usage error for any of them is an ``InputError`` before any run."""
    # hypothesis's plugin costs two of the listing's three seconds, and a listing runs no test
    quick = [] if any(a.startswith("--hypothesis") for a in extra) else ["-p", "no:hypothesispytest"]
    cmd = [sys.executable, "-m", "pytest", *plugin_args(), *quick, "--kvcm-list-defects-json", "-q",
           "--kvcm-version=both", *([f"--kvcm-lane={lane}"] if lane else []),
           *([f"--kvcm-target={target}"] if target else []), *extra]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    listing = next((line for line in proc.stdout.splitlines() if line.startswith("[")), None)
    if proc.returncode != 0 or listing is None:
        lines = [ln.strip() for ln in (proc.stderr + proc.stdout).splitlines() if ln.strip()]
        why = next((ln.split(": error: ", 1)[1] for ln in lines if ": error: " in ln), None)  # argparse's
        why = why or next((ln.removeprefix("ERROR: ") for ln in lines if ln.startswith("ERROR:")), None)  # UsageError
        why = why or (lines[-1] if lines else f"exit status {proc.returncode}")
        given = " ".join([*([f"--lane {lane}"] if lane else []), *([f"--target {target}"] if target else []),
                          *([f"--pytest-args {shlex.join(extra)!r}"] if extra else [])]) or "no options"
        raise InputError(f"pytest refuses the runs' options ({given}): {why}")
    return {d["name"]: d for d in json.loads(listing)}


def run_lane(lane: str, defect: str | None, extra: list[str], workdir: Path, tests: list[str] | None = None,
             label: str | None = None, target: str | None = None) -> dict:
    """One pytest process: the lane, or just ``tests`` (node ids) when given; ``defect`` injected if any."""
    junit = workdir / f"{label or defect or 'clean'}.xml"
    select = list(tests) if tests else [f"--kvcm-lane={lane}"]
    cmd = [sys.executable, "-m", "pytest", *plugin_args(), "-p", "pytest_kvcm.sensitivity", *select,
           "--kvcm-version=both", "-q", "-ra", "-p", "no:randomly", f"--junitxml={junit}", *extra]
    if defect:
        cmd.append(f"--kvcm-inject={defect}")
    if target:
        cmd.append(f"--kvcm-target={target}")
    start = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    return {"defect": defect, "returncode": proc.returncode, **junit_outcomes.read(junit),
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
        if run.get("broken"):
            result += f", {len(run['broken'])} broken (errored)"
        self._say(f"[{self.count}/{self.total}] {what}: {run['tests']} tests, {result} ({run['seconds']} s)")
        if self.bar is not None:
            self.bar.update(1)
        return run

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self.bar is not None:
            self.bar.close()


def _levels(tests: list[str]) -> list[str]:
    """The suites (managers, contract, engine, ...) the catching tests belong to; a module of the user's own by
    its name."""
    levels = set()
    for t in tests:
        module = t.partition("::")[0]
        parts = module.split(".")
        levels.add(parts[1] if parts[0] in ("suites", "pytest_kvcm") and len(parts) > 2 else module or "?")
    return sorted(levels)


def _named(test: str, catchers) -> bool:
    """Whether a JUnit id (``suites.x.test_f::test_g[p]``) is one of the node-id prefixes in ``catchers``."""
    module, _, name = test.partition("::")
    path = module.replace(".", "/") + ".py"
    return any(f"{path}::{name}".startswith(c) or path == c.rstrip("/") or path.startswith(c.rstrip("/") + "/")
               for c in catchers)


def main(args) -> int:
    try:
        return _main(args)
    except InputError as e:
        print(f"kvcm sensitivity: {e}", file=sys.stderr)
        return 2


def _here(catcher: str) -> bool:
    """Whether a catcher (a node-id prefix: a path from here, or a module given with ``--pyargs``) exists here."""
    where = catcher.partition("::")[0].rstrip("/")
    if "/" in where or where.endswith(".py"):
        return Path(where).exists()
    try:
        return importlib.util.find_spec(where) is not None
    except (ImportError, ValueError):
        return False


def _chosen_defects(args, registry: dict) -> list[str]:
    """``--defect``'s names, else every registered defect whose catchers are here. The built-in catalogue is
    caught by the project's own suites (``suites/``, in a checkout of pytest-kvcm, not in the wheel): from a
    maintainer's directory it is left out with one line, and the maintainer's own defects run."""
    if args.defect:
        names = list(dict.fromkeys(args.defect))
        unknown = [n for n in names if n not in registry]
        if unknown:
            raise InputError(f"unknown defect(s) {', '.join(unknown)}; registered: {', '.join(registry) or 'none'}")
        return names
    names = [n for n, d in registry.items() if not d["catchers"] or any(_here(c) for c in d["catchers"])]
    away = [n for n in registry if n not in names]
    if away:
        first = registry[away[0]]["catchers"][0].partition("::")[0]
        print(f"kvcm sensitivity: {len(away)} registered defect(s) left out, their catchers not here (as {first}): "
              "the built-in catalogue is caught by pytest-kvcm's own suites, in a checkout of its repository "
              f"(--defect NAME runs one anyway); running {len(names)}", file=sys.stderr)
    if not names:
        raise InputError("no defect to run here: register your own with the pytest_kvcm_register_defects hook of "
                         "your conftest.py (catchers: the tests that must fail), or run from a checkout of pytest-kvcm")
    return names


def _declared_line(run: dict) -> str | None:
    """What declared differences did to the tests a defect ran, or None."""
    keys = junit_outcomes.declared_keys(run.get("declared") or {})
    parts = [f"{kind} {sum(by.values())} of them ({', '.join(sorted(by))})" for kind, by in keys.items() if by]
    return f"declared differences {' and '.join(parts)}" if parts else None


def _report_defect(run: dict, d: dict, need: int, how: str, mode: str) -> bool:
    """Print one defect's verdict; True when it was caught by at least ``need`` failed checks."""
    caught, broken = run["caught_by"], run.get("broken") or []
    enough = len(caught) >= need
    verdict = (f"caught by {len(caught)} failed test(s) in {', '.join(_levels(caught))}" if caught else "UNCAUGHT")
    if caught and not enough:
        verdict += f": FEWER THAN {need}"
    if broken:
        verdict += f"; {len(broken)} broken"
    print(f"\n{run['defect']} ({verdict}; ran {how}, {run['seconds']} s): {d['story']}"
          + (f" [upstream: {d['upstream']}]" if d["upstream"] else ""))
    for test in caught:
        mark = "" if mode == "fast" or not d["catchers"] or _named(test, d["catchers"]) else "   (not named)"
        print(f"    {test}{mark}")
    if mode == "full" and d["catchers"]:
        for c in [c for c in d["catchers"] if not any(_named(t, [c]) for t in caught)]:
            print(f"    named but did not fail: {c}")
    for b in broken:
        print(f"    broken (errored before it could check; not a catch): {b['test']}: {b['why']}")
    declared = _declared_line(run)
    if declared:
        print(f"    {declared}")
    if not caught:
        print(f"    no check failed (exit {run['returncode']}, {run['tests']} tests ran"
              + ("; a defect in your own adapter needs --target NAME, or targets= at registration"
                 if "the session's targets" in how else "") + ")")
    return enough


def _main(args) -> int:
    extra, jobs = check_inputs(args)
    chosen = getattr(args, "target", None)
    registry = registered_defects(args.lane, chosen, extra)
    names = _chosen_defects(args, registry)
    mode, need = getattr(args, "mode", "fast"), getattr(args, "min_catchers", 2)
    if args.lane is None and (mode == "full" or any(not registry[n]["catchers"] for n in names)):
        registered_defects(DEFAULT_LANE, chosen, extra)  # the lane will run: check it before the first run
    args.lane = args.lane or DEFAULT_LANE
    targeted = {n: registry[n]["catchers"] for n in names if mode == "fast" and registry[n]["catchers"]}
    union = sorted({c for cs in targeted.values() for c in cs})
    own = {n: ",".join(registry[n].get("targets") or ()) or None for n in names}
    clean_target = chosen or ",".join(dict.fromkeys(t for n in names for t in registry[n].get("targets") or ())) or None
    plan = []  # (label, defect, tests, target): clean runs first
    if union:
        plan.append(("clean-catchers", None, union, clean_target))
    if len(targeted) < len(names):
        plan.append(("clean", None, None, clean_target))
    plan += [(n, n, targeted.get(n), chosen or own[n]) for n in names]
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="kvcm-sensitivity-") as tmp:
        with ThreadPoolExecutor(max_workers=jobs) as pool, Progress(len(plan), args.lane) as progress:
            runs = list(pool.map(lambda p: progress.done(run_lane(args.lane, p[1], extra, Path(tmp), p[2], p[0],
                                                                  p[3])), plan))
    cleans, defects = runs[:len(plan) - len(names)], runs[len(plan) - len(names):]
    ok = True
    for (label, _, tests, _target), clean in zip(plan, cleans):
        what = f"the {len(tests)} named catchers" if tests else f"lane {args.lane}"
        good = clean["returncode"] == 0 and not clean["caught_by"] and not clean["broken"] and clean["tests"] > 0
        ok &= good
        print(f"clean run of {what}: {clean['tests']} tests, {len(clean['caught_by'])} failed, "
              f"{len(clean['broken'])} broken, exit {clean['returncode']} ({clean['seconds']} s)")
        if not good:
            print(clean["tail"])
    print(f"\nmode {mode}: each defect must be caught by at least {need} failed checks (a test that errors is "
          f"broken, not a catch)\ndefect (upstream): what it was\n    the tests that caught it")
    for run in defects:
        how = "its named catchers" if run["defect"] in targeted else f"lane {args.lane}"
        on = chosen or own[run["defect"]]
        how += f", --kvcm-target={on}" if on else ", the session's targets"
        ok &= _report_defect(run, registry[run["defect"]], need, how, mode)
    if args.json:
        try:
            write_atomically(args.json, json.dumps({"mode": mode, "clean": cleans, "defects": defects}, indent=2))
        except OSError as e:  # checked at the start; the directory changed since (the table above still stands)
            print(f"kvcm sensitivity: --json {args.json}: cannot be written ({e.strerror or e})", file=sys.stderr)
            ok = False
    print(f"\nsensitivity ({mode}, {len(defects)} defects, {round(time.monotonic() - start)} s): "
          + ("every defect caught" + (f" by at least {need} tests" if need > 1 else "") if ok
             else "FAILED: a defect went uncaught or under-caught (broken tests do not count), or a clean run "
                  "failed"))
    return 0 if ok else 1
