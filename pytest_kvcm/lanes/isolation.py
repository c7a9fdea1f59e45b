"""ISOLATION: a lane entry marked ``ISOLATION`` runs in a subprocess of its own (``python -m pytest <node id>``
with this run's options), its reports replayed in the parent, so a crash, a leaked CUDA context or a global it
changes cannot touch the tests after it. A failure to start or a crash of that subprocess is reported as the
test's failure, with its exit code and output tail; the child applies the entry's TIMEOUT and XFAIL itself.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ENV_ISOLATED = "KVCM_ISOLATED"  # set for an ISOLATION child: JSON {nodeid, reports, timeout, xfail}
_CHILD = pytest.StashKey[dict]()
ISOLATE = pytest.StashKey[dict]()  # on an item: {"timeout": seconds | None, "xfail": reason | None}


def is_child(config: pytest.Config) -> bool:
    """True in the subprocess of an isolated test: lanes and waives were decided by the parent."""
    return _CHILD in config.stash


@pytest.hookimpl(tryfirst=True)  # before selection's configure, which steps aside in a child
def pytest_configure(config: pytest.Config) -> None:
    child = os.environ.pop(ENV_ISOLATED, None)  # popped: a pytester run inside the child is not a child
    if child:
        config.stash[_CHILD] = json.loads(child)
        config.pluginmanager.register(_IsolatedChild(config), "kvcm-isolated-child")


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    if is_child(config):
        _mark_child(config, items)


#: options not forwarded to an isolated child: positional paths are replaced by the node id; xdist would
#: distribute a single test; report files would be written twice; basetemp is the parent's (the child would
#: wipe it); the lane/waives are decided by the parent.
_DROP_WITH_VALUE = ("-n", "--numprocesses", "--dist", "--tx", "--maxprocesses", "--max-worker-restart",
                    "--basetemp", "--junitxml", "--junit-xml", "--kvcm-results", "--kvcm-lane", "--kvcm-waives",
                    "--kvcm-lane-dir", "--html", "--benchmark-json", "--benchmark-save", "-d")
_DROP_FLAGS = ("--looponfail", "-f", "--lf", "--ff", "--sw", "--stepwise")


def child_args(invocation_args: list[str], positional: list[str]) -> list[str]:
    out, skip_next = [], False
    for arg in invocation_args:
        if skip_next:
            skip_next = False
            continue
        if arg in positional or arg in _DROP_FLAGS:
            continue
        name, eq, _ = arg.partition("=")
        if name in _DROP_WITH_VALUE:
            skip_next = not eq
            continue
        if arg.startswith("-n") and arg[2:].isalnum() and not arg.startswith("--"):  # -n4, -nauto
            continue
        out.append(arg)
    return out


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> bool | None:
    spec = item.stash.get(ISOLATE, None)
    if spec is None or item.get_closest_marker("skip") is not None:
        return None
    item.ihook.pytest_runtest_logstart(nodeid=item.nodeid, location=item.location)
    for report in _run_isolated(item, spec):
        item.ihook.pytest_runtest_logreport(report=report)
    # the parent set up nothing for this item, but the previous item's teardown kept what it shares with it
    call = pytest.CallInfo.from_call(lambda: item.session._setupstate.teardown_exact(nextitem), when="teardown")
    if call.excinfo is not None:
        item.ihook.pytest_runtest_logreport(report=item.ihook.pytest_runtest_makereport(item=item, call=call))
    item.ihook.pytest_runtest_logfinish(nodeid=item.nodeid, location=item.location)
    return True


def _run_isolated(item: pytest.Item, spec: dict) -> list[pytest.TestReport]:
    config = item.config
    path, _, rest = item.nodeid.partition("::")
    target = str(config.rootpath / path) + (f"::{rest}" if rest else "")
    with tempfile.TemporaryDirectory(prefix="kvcm-isolated-") as tmp:
        reports_path = Path(tmp) / "reports.jsonl"
        env = dict(os.environ)
        env[ENV_ISOLATED] = json.dumps({"nodeid": item.nodeid, "reports": str(reports_path), **spec})
        env.pop("PYTEST_XDIST_WORKER", None)  # the child is no worker: it must neither shard nor report to xdist
        args = child_args(list(config.invocation_params.args), list(config.option.file_or_dir or []))
        if config.pluginmanager.hasplugin("xdist"):
            args.append("-n0")  # PYTEST_ADDOPTS may hold -n
        cmd = [sys.executable, "-m", "pytest", *args, f"--basetemp={tmp}/basetemp", target]
        limit = spec["timeout"] * 1.5 + 60 if spec.get("timeout") else None
        try:
            proc = subprocess.run(cmd, cwd=config.invocation_params.dir, env=env, capture_output=True,
                                  text=True, timeout=limit)
            rc, output = proc.returncode, proc.stdout + proc.stderr
        except subprocess.TimeoutExpired as e:
            rc = None
            partial = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
            output = f"killed after {limit:.0f} s (TIMEOUT {spec['timeout'] / 60:g} min x 1.5 + 60 s)\n{partial}"
        reports = []
        if reports_path.exists():
            for line in reports_path.read_text().splitlines():
                rep = config.hook.pytest_report_from_serializable(config=config, data=json.loads(line))
                rep.nodeid, rep.location = item.nodeid, item.location
                reports.append(rep)
    if not any(r.when == "call" or r.failed or r.skipped for r in reports) or rc not in (0, 1):
        tail = "\n".join(output.splitlines()[-40:]) or "(no output)"
        why = "was killed" if rc is None else f"exited with code {rc}"
        text = (f"ISOLATION: `{' '.join(cmd)}` {why} after {len(reports)} report(s) for {item.nodeid}\n"
                f"--- last lines of its output ---\n{tail}")
        crash = pytest.TestReport(item.nodeid, item.location, {k: 1 for k in item.keywords}, "failed", text, "call")
        if spec.get("xfail"):  # an expected failure may be a crash: reported as xfailed, like pytest would
            crash.outcome, crash.wasxfail = "skipped", f"{spec['xfail']}; {text.splitlines()[0]}"
        reports.append(crash)
    return reports


class _IsolatedChild:
    """The child side of ISOLATION: apply the parent's marks, write every test report for the parent."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.spec = config.stash[_CHILD]

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        data = self.config.hook.pytest_report_to_serializable(config=self.config, report=report)
        with open(self.spec["reports"], "a") as f:
            f.write(json.dumps(data) + "\n")


def _mark_child(config: pytest.Config, items: list[pytest.Item]) -> None:
    spec = config.stash[_CHILD]
    for item in items:
        if spec.get("xfail"):
            item.add_marker(pytest.mark.xfail(reason=spec["xfail"]))
        if spec.get("timeout") and config.pluginmanager.hasplugin("timeout"):
            item.add_marker(pytest.mark.timeout(spec["timeout"]))
