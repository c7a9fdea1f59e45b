"""Lanes: ``--kvcm-lane=l0_cpu`` runs exactly the tests ``ci/l0_cpu.yml`` lists for this machine, in its order.

A lane file (SEMANTICS 9) holds one context named after the lane, a list of blocks::

    version: 0.0.1
    l0_h100:
    - condition:
        ranges: {system_gpu_count: {gte: 1}}
        wildcards: {gpu: ['*h100*']}
        terms: {stage: pre_merge}
      tests:
      - suites/managers                                   # a directory: every test under it
      - suites/engine/test_llm.py::test_generate TIMEOUT (5)
      - suites/plugin/test_lanes.py ISOLATION
      - suites/managers/test_v2.py::test_fp8 SKIP (no fp8 on CPU)
      - suites/managers/test_v2.py::test_swa XFAIL (window rounding)  # a comment

A block contributes its tests when every condition holds on this machine (:mod:`pytest_kvcm.machine`,
``as_condition_keys``): ``ranges`` are inclusive ``gte``/``lte`` (and strict ``gt``/``lt``), ``wildcards`` are
case-insensitive shell patterns of which any may match, ``terms`` are exact (a list = any of). A key the machine
does not report matches. An entry is a node id, a file or a directory; ``file::test`` also takes all of that
test's parametrizations. The session runs the selected tests in lane order (inside a file or directory entry,
collection order); an item named twice keeps its first place, and later entries add to / override its marks.

Markers: ``TIMEOUT (minutes)`` adds ``pytest.mark.timeout`` (pytest-timeout); ``SKIP (reason)`` and
``XFAIL (reason)`` add those marks; ``ISOLATION`` runs the test in a subprocess of its own (``python -m pytest
<node id>`` with this run's options, its reports replayed here), so a crash, a leaked CUDA context or a global
it changes cannot touch the tests after it. A failure to start or a crash of that subprocess is reported as
the test's failure, with its exit code and output tail.

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
import fnmatch
import json
import os
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Any

import pytest
import yaml

from pytest_kvcm.machine import host_machine_for

ENV_ISOLATED = "KVCM_ISOLATED"  # set for an ISOLATION child: JSON {nodeid, reports, timeout, xfail}
_STATE = pytest.StashKey["LaneState"]()
_CHILD = pytest.StashKey[dict]()
_ISOLATE = pytest.StashKey[dict]()  # on an item: {"timeout": seconds | None, "xfail": reason | None}

KEYWORDS = ("TIMEOUT", "ISOLATION", "SKIP", "XFAIL")
BOUNDS = {"gte": lambda v, b: v >= b, "lte": lambda v, b: v <= b, "gt": lambda v, b: v > b, "lt": lambda v, b: v < b}
BOUND_TEXT = {"gte": ">=", "lte": "<=", "gt": ">", "lt": "<"}


# ---------------------------------------------------------------- the file format


@dataclasses.dataclass(frozen=True)
class Entry:
    """One test line: an id (node id, file or directory, relative to rootdir) and its markers."""

    id: str
    where: str  # "ci/l0_cpu.yml block 1 entry 3", for messages
    timeout_min: float | None = None
    isolation: bool = False
    skip: str | None = None
    xfail: str | None = None

    @property
    def path(self) -> str:
        return self.id.split("::", 1)[0]

    def matches(self, nodeid: str) -> bool:
        e = self.id
        return nodeid == e or nodeid.startswith((e + "::", e + "[", e + "/"))


def _split_comment(text: str) -> str:
    """Drop a ``#`` comment that is outside brackets/parentheses and starts a word (node ids may hold '#')."""
    depth = 0
    for i, ch in enumerate(text):
        if ch in "([":
            depth += 1
        elif ch in ")]":
            depth = max(0, depth - 1)
        elif ch == "#" and depth == 0 and (i == 0 or text[i - 1].isspace()):
            return text[:i]
    return text


def _tokens(text: str) -> list[str]:
    """Whitespace-separated words, keeping ``(...)`` and ``[...]`` groups (with their spaces) in one word."""
    out, cur, depth = [], "", 0
    for ch in text:
        if ch.isspace() and depth == 0:
            if cur:
                out.append(cur)
            cur = ""
            continue
        if ch in "([":
            depth += 1
        elif ch in ")]" and depth:
            depth -= 1
        cur += ch
    if depth:
        raise ValueError(f"unbalanced brackets in {text.strip()!r}")
    if cur:
        out.append(cur)
    return out


def parse_entry(line: str, where: str) -> Entry | None:
    """``id [TIMEOUT (m)] [ISOLATION] [SKIP (reason)] [XFAIL (reason)] [# comment]``; None for a blank line."""
    try:
        words = _tokens(_split_comment(line))
    except ValueError as e:
        raise pytest.UsageError(f"{where}: {e}") from None
    if not words:
        return None
    test_id = words[0].removeprefix("./").rstrip("/")
    fields: dict[str, Any] = {}
    i = 1
    while i < len(words):
        word = words[i]
        key, _, glued = word.partition("(")  # "SKIP(reason)" as well as "SKIP (reason)"
        if key not in KEYWORDS:
            raise pytest.UsageError(f"{where}: unknown marker {word!r} in {line.strip()!r}; known: {list(KEYWORDS)}")
        arg = None
        if glued:
            arg = "(" + glued
        elif i + 1 < len(words) and words[i + 1].startswith("("):
            i += 1
            arg = words[i]
        if arg is not None:
            if not arg.endswith(")"):
                raise pytest.UsageError(f"{where}: {key} argument {arg!r} must be in parentheses")
            arg = arg[1:-1].strip()
        if key == "ISOLATION":
            if arg is not None:
                raise pytest.UsageError(f"{where}: ISOLATION takes no argument, given ({arg})")
            fields["isolation"] = True
        elif key == "TIMEOUT":
            try:
                minutes = float(arg) if arg is not None else None
            except ValueError:
                minutes = None
            if minutes is None or minutes <= 0:
                raise pytest.UsageError(f"{where}: TIMEOUT needs minutes > 0 in parentheses, e.g. TIMEOUT (5); "
                                        f"given {arg!r}")
            fields["timeout_min"] = minutes
        else:
            if not arg:
                raise pytest.UsageError(f"{where}: {key} needs a reason in parentheses, e.g. {key} (why)")
            fields[key.lower()] = arg
        i += 1
    return Entry(id=test_id, where=where, **fields)


@dataclasses.dataclass(frozen=True)
class Block:
    index: int  # 1-based, for messages
    condition: dict
    entries: tuple[Entry, ...]


@dataclasses.dataclass(frozen=True)
class Lane:
    name: str
    path: Path
    blocks: tuple[Block, ...]


def _check_condition(cond: Any, where: str) -> dict:
    if cond is None:
        return {}
    if not isinstance(cond, dict):
        raise pytest.UsageError(f"{where}: condition must be a mapping, got {cond!r}")
    unknown = sorted(set(cond) - {"ranges", "wildcards", "terms"})
    if unknown:
        raise pytest.UsageError(f"{where}: unknown condition section(s) {unknown}; known: ranges, wildcards, terms")
    for section in ("ranges", "wildcards", "terms"):
        body = cond.get(section) or {}
        if not isinstance(body, dict):
            raise pytest.UsageError(f"{where}: condition {section} must map keys to values, got {body!r}")
    for key, bounds in (cond.get("ranges") or {}).items():
        if not isinstance(bounds, dict) or not bounds:
            raise pytest.UsageError(f"{where}: ranges.{key} must be a mapping like {{gte: 1}}, got {bounds!r}")
        for b, v in bounds.items():
            if b not in BOUNDS:
                raise pytest.UsageError(f"{where}: ranges.{key}.{b}: unknown bound; known: {list(BOUNDS)}")
            if not isinstance(v, (int, float)) or isinstance(v, bool):
                raise pytest.UsageError(f"{where}: ranges.{key}.{b}={v!r}: must be a number")
    return cond


def load_lane(path: Path, rootpath: Path | None = None) -> Lane:
    """Parse and check ``path``; every error names the file, the block and the field."""
    name = path.stem
    shown = _rel(path, rootpath)
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise pytest.UsageError(f"lane file {shown}: invalid YAML: {e}") from None
    if not isinstance(data, dict) or name not in data:
        found = sorted(k for k in data if k != "version") if isinstance(data, dict) else type(data).__name__
        raise pytest.UsageError(f"lane file {shown}: expected a context named {name!r} (the file's name); found {found}")
    extra = sorted(set(data) - {name, "version"})
    if extra:
        raise pytest.UsageError(f"lane file {shown}: unexpected top-level key(s) {extra}; a lane file holds "
                                f"'version' and one context named {name!r}")
    raw_blocks = data[name] or []
    if not isinstance(raw_blocks, list):
        raise pytest.UsageError(f"lane file {shown}: {name} must be a list of blocks, got {type(raw_blocks).__name__}")
    blocks = []
    for b, raw in enumerate(raw_blocks, start=1):
        where = f"{shown} block {b}"
        if not isinstance(raw, dict) or "tests" not in raw:
            raise pytest.UsageError(f"{where}: a block is a mapping with 'tests' (and optional 'condition'), got {raw!r}")
        unknown = sorted(set(raw) - {"condition", "tests"})
        if unknown:
            raise pytest.UsageError(f"{where}: unknown key(s) {unknown}; known: condition, tests")
        tests = raw["tests"] or []
        if not isinstance(tests, list):
            raise pytest.UsageError(f"{where}: tests must be a list of strings, got {tests!r}")
        entries = []
        for t, line in enumerate(tests, start=1):
            if not isinstance(line, str):
                raise pytest.UsageError(f"{where} entry {t}: must be a string, got {line!r}")
            entry = parse_entry(line, f"{where} entry {t}")
            if entry is not None:
                entries.append(entry)
        blocks.append(Block(b, _check_condition(raw.get("condition"), where), tuple(entries)))
    return Lane(name, path, tuple(blocks))


def condition_mismatch(cond: dict, keys: dict[str, Any]) -> str | None:
    """None when every condition holds, else why not ("gpu 'none' matches none of ['*h100*']")."""
    for key, bounds in (cond.get("ranges") or {}).items():
        if key not in keys:
            continue
        value = keys[key]
        if not isinstance(value, (int, float)):
            return f"{key} {value!r} is not a number for ranges"
        for b, limit in bounds.items():
            if not BOUNDS[b](value, limit):
                return f"{key} {value} is not {BOUND_TEXT[b]} {limit}"
    for key, patterns in (cond.get("wildcards") or {}).items():
        if key not in keys:
            continue
        pats = patterns if isinstance(patterns, list) else [patterns]
        value = str(keys[key]).lower()
        if not any(fnmatch.fnmatchcase(value, str(p).lower()) for p in pats):
            return f"{key} {value!r} matches none of {pats}"
    for key, terms in (cond.get("terms") or {}).items():
        if key not in keys:
            continue
        allowed = terms if isinstance(terms, list) else [terms]
        if str(keys[key]) not in [str(t) for t in allowed]:
            return f"{key} {keys[key]!r} is not {allowed[0]!r}" if len(allowed) == 1 else \
                f"{key} {keys[key]!r} is not one of {allowed}"
    return None


def condition_weight(cond: dict, keys: dict[str, Any]) -> int:
    """How many reported keys a condition tests: the specificity ``auto`` ranks lanes by."""
    return sum(1 for section in ("ranges", "wildcards", "terms") for k in (cond.get(section) or {}) if k in keys)


def pick_auto(lane_dir: Path, keys: dict[str, Any], rootpath: Path | None = None) -> tuple[Lane, str]:
    """The most specific lane with a block matching ``keys`` (ties: file name order), and why it was chosen."""
    files = sorted([*lane_dir.glob("*.yml"), *lane_dir.glob("*.yaml")])
    if not files:
        raise pytest.UsageError(f"--kvcm-lane=auto: no lane file (*.yml) in {_rel(lane_dir, rootpath)}")
    best, best_weight, rejected = None, -1, []
    for f in files:
        lane = load_lane(f, rootpath)
        weights = []
        for block in lane.blocks:
            why = condition_mismatch(block.condition, keys)
            if why is None:
                weights.append(condition_weight(block.condition, keys))
            else:
                rejected.append(f"{lane.name} block {block.index}: {why}")
        if weights and max(weights) > best_weight:
            best, best_weight = lane, max(weights)
    if best is None:
        raise pytest.UsageError(
            f"--kvcm-lane=auto: none of the {len(files)} lane file(s) in {_rel(lane_dir, rootpath)} has a block "
            f"matching this machine ({_keys_text(keys)}): " + "; ".join(rejected)
        )
    return best, f"auto: most specific of {len(files)} lane file(s), {best_weight} key(s) matched"


def load_waives(path: Path, rootpath: Path | None = None) -> list[Entry]:
    shown = _rel(path, rootpath)
    entries = []
    for n, line in enumerate(path.read_text().splitlines(), start=1):
        entry = parse_entry(line, f"{shown}:{n}")
        if entry is None:
            continue
        if entry.isolation or entry.timeout_min is not None or not (entry.skip or entry.xfail):
            raise pytest.UsageError(f"{shown}:{n}: a waive is 'node_id SKIP (reason)' (or XFAIL (reason)); "
                                    f"given {line.strip()!r}")
        entries.append(entry)
    return entries


# ---------------------------------------------------------------- selection


@dataclasses.dataclass
class LaneState:
    lane: Lane | None
    why: str  # how the lane was chosen
    matched: list[Block]
    keys: dict[str, Any]
    waives: list[Entry]
    waives_path: Path | None
    summary: str | None = None


def _rel(path: Path, rootpath: Path | None) -> str:
    try:
        return str(path.resolve().relative_to(rootpath.resolve())) if rootpath else str(path)
    except ValueError:
        return str(path)


def _keys_text(keys: dict[str, Any]) -> str:
    shown = ("system_gpu_count", "gpu", "gpu_memory_gb", "sm", "stage")
    return ", ".join(f"{k}={keys[k]!r}" for k in shown if k in keys)


def _path_candidates(rootpath: Path, missing: str) -> list[str]:
    """Existing files/dirs near a missing path: under its nearest existing ancestor (bounded walk)."""
    anchor = rootpath / missing
    while anchor != rootpath and not anchor.exists():
        anchor = anchor.parent
    out = []
    for dirpath, dirnames, filenames in os.walk(anchor):
        dirnames[:] = [d for d in dirnames if not d.startswith((".", "__")) and d not in ("node_modules", "venv")]
        base = Path(dirpath)
        out.append(_rel(base, rootpath))
        out.extend(_rel(base / f, rootpath) for f in filenames if f.endswith(".py"))
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
            raise pytest.UsageError(f"--kvcm-lane={name}: no lane file {_rel(path, config.rootpath)}; "
                                    f"lanes in {_rel(lane_dir, config.rootpath)}: {known or 'none'}")
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


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("kvcm")
    group.addoption("--kvcm-lane", dest="kvcm_lane", default=None, metavar="NAME",
                    help="run the tests of lane NAME (ci/NAME.yml, or a .yml path; 'auto' picks one for this machine)")
    group.addoption("--kvcm-lane-dir", dest="kvcm_lane_dir", default=None, metavar="DIR",
                    help="where lane files live, relative to rootdir (default ci)")
    group.addoption("--kvcm-waives", dest="kvcm_waives", default=None, metavar="PATH",
                    help="waives file: lines 'node_id SKIP (reason)' (default ci/waives.txt under rootdir, if present)")
    group.addoption("--kvcm-lane-all-blocks", dest="kvcm_lane_all_blocks", action="store_true", default=False,
                    help="select every block of the lane whatever its condition (with --collect-only: check every "
                    "id of a GPU lane on a CPU machine)")
    group.addoption("--kvcm-stage", dest="kvcm_stage", default=None, metavar="STAGE",
                    help="the 'stage' lane conditions test (default pre_merge)")
    parser.addini("kvcm_lane", "default for --kvcm-lane", default="")
    parser.addini("kvcm_lane_dir", "default for --kvcm-lane-dir", default="ci")
    parser.addini("kvcm_waives", "default for --kvcm-waives", default="ci/waives.txt")


def pytest_configure(config: pytest.Config) -> None:
    child = os.environ.pop(ENV_ISOLATED, None)  # popped: a pytester run inside the child is not a child
    if child:
        config.stash[_CHILD] = json.loads(child)
        config.pluginmanager.register(_IsolatedChild(config), "kvcm-isolated-child")
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
    if _CHILD in config.stash:
        _mark_child(config, items)
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
            item.stash[_ISOLATE] = {"timeout": timeout, "xfail": xfail}
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
    lines = [f"kvcm lane {state.lane.name} ({_rel(state.lane.path, config.rootpath)}): "
             f"{len(state.matched)} of {len(state.lane.blocks)} block(s) match {_keys_text(state.keys)}"]
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


# ---------------------------------------------------------------- ISOLATION

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
    spec = item.stash.get(_ISOLATE, None)
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
