"""Lane selection: ``--kvcm-lane=l0_cpu`` runs exactly the tests ``ci/l0_cpu.yml`` lists for this machine, in
its order, with its marks; waives apply with or without a lane; xdist workers select as their controller does.

What is collected: with a lane and no paths on the command line, the paths of the matched entries (not
``testpaths``). Errors are caught before anything runs: an entry naming no existing path, or a node id in a
collected file that names no collected test, stops the run (exit code 4) suggesting the nearest real ids.

Waives (``--kvcm-waives``, default ``ci/waives.txt``; lines ``node_id SKIP (reason)``, ``#`` comments) are
applied after selection, with or without a lane. A waive naming nothing collected is a warning, not an error
(a waive may be for a test this run did not collect).

``--kvcm-lane-all-blocks`` ignores the conditions (every block selected): with ``--collect-only`` it checks
every id of a GPU lane on a CPU runner, where the GPU blocks' files are otherwise not collected.

``--kvcm-lane=auto`` picks, among the lane files of ``--kvcm-lane-dir`` with a block matching this machine, the
one whose matching block tests the most keys (ties: file name order). With the shipped files that is
``l0_h200`` on a host with an H200, ``l0_h100`` with an H100, else ``l0_cpu``.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import warnings
from pathlib import Path
from typing import Any

import pytest

from pytest_kvcm.machine import host_machine_for

from .file_format import (Block, Entry, Lane, condition_mismatch, keys_text, load_lane, load_waives, pick_auto,
                          rel_path)
from .isolation import ISOLATE, is_child

_STATE = pytest.StashKey["LaneState"]()


@dataclasses.dataclass
class LaneState:
    lane: Lane | None
    why: str  # how the lane was chosen
    matched: list[Block]
    keys: dict[str, Any]
    waives: list[Entry]
    waives_path: Path | None
    summary: str | None = None


def _path_candidates(rootpath: Path, missing: str) -> list[str]:
    """Existing files/dirs near a missing path: under its nearest existing ancestor (bounded walk)."""
    anchor = rootpath / missing
    while anchor != rootpath and not anchor.exists():
        anchor = anchor.parent
    out = []
    for dirpath, dirnames, filenames in os.walk(anchor):
        dirnames[:] = [d for d in dirnames if not d.startswith((".", "__")) and d not in ("node_modules", "venv")]
        base = Path(dirpath)
        out.append(rel_path(base, rootpath))
        out.extend(rel_path(base / f, rootpath) for f in filenames if f.endswith(".py"))
        if len(out) > 5000:
            break
    return out


def _unknown(entry: Entry, candidates: list[str], what: str) -> str:
    near = difflib.get_close_matches(entry.id, candidates, n=3, cutoff=0.6)
    hint = "did you mean: " + ", ".join(near) if near else f"no similar id among {len(candidates)} known"
    return f"{entry.where}: {entry.id!r} {what}; {hint}"


def _resolve_lane(config: pytest.Config) -> LaneState | None:
    name = config.getoption("kvcm_lane") or config.getini("kvcm_lane")
    waives_opt = config.getoption("kvcm_waives")
    waives_path = Path(waives_opt or config.getini("kvcm_waives") or "ci/waives.txt")
    if not waives_path.is_absolute():
        waives_path = (config.invocation_params.dir if waives_opt else config.rootpath) / waives_path
    if waives_path.is_file():
        waives = load_waives(waives_path, config.rootpath)
    elif waives_opt:
        raise pytest.UsageError(f"--kvcm-waives={waives_opt}: no such file ({waives_path})")
    else:
        waives, waives_path = [], None
    if not name:
        return LaneState(None, "", [], {}, waives, waives_path) if waives else None

    lane_dir = Path(config.getoption("kvcm_lane_dir") or config.getini("kvcm_lane_dir") or "ci")
    if not lane_dir.is_absolute():
        lane_dir = config.rootpath / lane_dir
    keys = host_machine_for(config).as_condition_keys()
    if name == "auto":
        lane, why = pick_auto(lane_dir, keys, config.rootpath)
    else:
        path = Path(name) if name.endswith((".yml", ".yaml")) else lane_dir / f"{name}.yml"
        if not path.is_absolute() and name.endswith((".yml", ".yaml")):
            path = config.invocation_params.dir / path
        if not path.is_file():
            known = sorted(p.stem for p in lane_dir.glob("*.y*ml")) if lane_dir.is_dir() else []
            raise pytest.UsageError(f"--kvcm-lane={name}: no lane file {rel_path(path, config.rootpath)}; "
                                    f"lanes in {rel_path(lane_dir, config.rootpath)}: {known or 'none'}")
        lane, why = load_lane(path, config.rootpath), ""
    if config.getoption("kvcm_lane_all_blocks"):
        matched, why = list(lane.blocks), (why + "; " if why else "") + "--kvcm-lane-all-blocks"
    else:
        matched = [b for b in lane.blocks if condition_mismatch(b.condition, keys) is None]

    # every entry of every block must name an existing path (a typo in a GPU block is caught on a CPU runner)
    errors = [
        _unknown(e, _path_candidates(config.rootpath, e.path), "is not an existing file or directory")
        for b in lane.blocks for e in b.entries if not (config.rootpath / e.path).exists()
    ]
    if errors:
        raise pytest.UsageError(f"lane {lane.name}: {len(errors)} unknown test id(s):\n  " + "\n  ".join(errors))
    return LaneState(lane, why, matched, keys, waives, waives_path)



def pytest_configure(config: pytest.Config) -> None:
    if is_child(config):
        return
    state = _resolve_lane(config)
    if state is None:
        return
    config.stash[_STATE] = state
    if state.lane is not None and config.args_source != pytest.Config.ArgsSource.ARGS:
        paths = dict.fromkeys(str(config.rootpath / e.path) for b in state.matched for e in b.entries)
        config.args = list(paths)
        config.args_source = pytest.Config.ArgsSource.ARGS


def _merge(marks: dict, entry: Entry) -> None:
    for field in ("timeout_min", "skip", "xfail"):
        if getattr(entry, field) is not None:
            marks[field] = (getattr(entry, field), entry.where)
    if entry.isolation:
        marks["isolation"] = (True, entry.where)


@pytest.hookimpl(tryfirst=True)  # before -k/-m deselection, so the lane is checked against the whole collection
def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    if is_child(config):  # isolation.py marks the child's items
        return
    state = config.stash.get(_STATE, None)
    if state is None:
        return
    marks: dict[str, dict] = {}
    if state.lane is not None:
        _check_node_ids(state, items)
        order: dict[str, int] = {}
        for block in state.matched:
            for entry in block.entries:
                for item in items:
                    if entry.matches(item.nodeid):
                        order.setdefault(item.nodeid, len(order))
                        _merge(marks.setdefault(item.nodeid, {}), entry)
        selected = sorted((i for i in items if i.nodeid in order), key=lambda i: order[i.nodeid])
        dropped = [i for i in items if i.nodeid not in order]
        if dropped:
            config.hook.pytest_deselected(items=dropped)
        items[:] = selected
    waived = _apply_waives(state, items, marks, config.rootpath)
    timeouts = _apply_marks(config, items, marks)
    if state.lane is not None:
        isolated = sum(1 for m in marks.values() if "isolation" in m)
        how = f" ({state.why})" if state.why else ""
        state.summary = (
            f"kvcm lane {state.lane.name}{how}: {len(items)} tests selected from {len(state.lane.blocks)} blocks "
            f"({len(state.matched)} matched)" + (f"; {waived} waived" if waived else "")
            + (f"; {isolated} isolated" if isolated else "") + (f"; {timeouts} with TIMEOUT" if timeouts else "")
        )
        if hasattr(config, "workeroutput"):
            config.workeroutput["kvcm_lane"] = state.summary


def _check_node_ids(state: LaneState, items: list[pytest.Item]) -> None:
    """A node id in a file that was collected must name a collected test (a file with no collected test —
    skipped at import, or not on this command line — cannot be checked, and is not an error)."""
    files: set[str] = {i.nodeid.split("::", 1)[0] for i in items}
    ids = [i.nodeid for i in items]
    errors = [
        _unknown(e, ids + sorted(files), "is not a collected test")
        for b in state.lane.blocks for e in b.entries
        if "::" in e.id and e.path in files and not any(e.matches(n) for n in ids)
    ]
    if errors:
        raise pytest.UsageError(f"lane {state.lane.name}: {len(errors)} unknown test id(s):\n  " + "\n  ".join(errors))


def _apply_waives(state: LaneState, items: list[pytest.Item], marks: dict[str, dict], rootpath: Path) -> int:
    """Waive marks go on the selected items; a waive that is stale (its path is gone, or its file was collected
    without the test) is a warning naming the nearest ids — not an error, as the file outlives renames."""
    waived: set[str] = set()
    files = {i.nodeid.split("::", 1)[0] for i in items}
    ids = [i.nodeid for i in items]
    for w in state.waives:
        hits = [n for n in ids if w.matches(n)]
        for nodeid in hits:
            _merge(marks.setdefault(nodeid, {}), w)
            waived.add(nodeid)
        gone = not (rootpath / w.path).exists()
        if not hits and (gone or ("::" in w.id and w.path in files)):
            near = difflib.get_close_matches(w.id, ids, n=3, cutoff=0.6)
            what = f"path {w.path!r} does not exist" if gone else f"matches none of the {len(ids)} selected tests"
            warnings.warn(pytest.PytestConfigWarning(
                f"{w.where}: waive {w.id!r}: {what}" + (f"; did you mean: {', '.join(near)}" if near else "")))
    return len(waived)


def _apply_marks(config: pytest.Config, items: list[pytest.Item], marks: dict[str, dict]) -> int:
    has_timeout = config.pluginmanager.hasplugin("timeout")
    timed = 0
    for item in items:
        m = marks.get(item.nodeid)
        if not m:
            continue
        if "skip" in m:
            reason, where = m["skip"]
            item.add_marker(pytest.mark.skip(reason=f"{reason} ({where})"))
        xfail = f"{m['xfail'][0]} ({m['xfail'][1]})" if "xfail" in m else None
        timeout = m["timeout_min"][0] * 60 if "timeout_min" in m else None
        timed += timeout is not None
        if "isolation" in m:  # the child applies TIMEOUT/XFAIL itself
            item.stash[ISOLATE] = {"timeout": timeout, "xfail": xfail}
            continue
        if xfail:
            item.add_marker(pytest.mark.xfail(reason=xfail))
        if timeout is not None and has_timeout:
            item.add_marker(pytest.mark.timeout(timeout))
    if timed and not has_timeout:
        warnings.warn(pytest.PytestConfigWarning(
            f"{timed} test(s) have a lane TIMEOUT but pytest-timeout is not installed: no time limit applied"))
    return timed


def pytest_report_collectionfinish(config: pytest.Config) -> str | None:
    state = config.stash.get(_STATE, None)
    return state.summary if state is not None else None


def pytest_report_header(config: pytest.Config) -> list[str] | None:
    state = config.stash.get(_STATE, None)
    if state is None or state.lane is None:
        return None
    lines = [f"kvcm lane {state.lane.name} ({rel_path(state.lane.path, config.rootpath)}): "
             f"{len(state.matched)} of {len(state.lane.blocks)} block(s) match {keys_text(state.keys)}"]
    for block in state.lane.blocks:
        why = None if block in state.matched else condition_mismatch(block.condition, state.keys)
        if why:
            lines.append(f"  block {block.index} ({len(block.entries)} entries) not matched: {why}")
    return lines


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node) -> None:
    """xdist controller: send the host's facts so every worker evaluates the lane conditions the same way."""
    if _STATE in node.config.stash and node.config.stash[_STATE].lane is not None:
        node.workerinput["kvcm_machine"] = host_machine_for(node.config).to_dict()


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error) -> None:
    line = getattr(node, "workeroutput", {}).get("kvcm_lane")
    state = node.config.stash.get(_STATE, None)
    if line and state is not None and state.summary is None:
        state.summary = line


def pytest_terminal_summary(terminalreporter, config: pytest.Config) -> None:
    state = config.stash.get(_STATE, None)
    if state is not None and state.summary and hasattr(config.option, "numprocesses") \
            and config.option.numprocesses and not hasattr(config, "workerinput"):
        terminalreporter.write_line(state.summary)  # under xdist, the workers collected: their line, at the end
