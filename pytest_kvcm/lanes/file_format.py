"""The lane file format (docs/semantics.md 9): parsing, checking, condition matching, ``auto`` picking, waives files.

A lane file holds one context named after the lane, a list of blocks::

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

Markers: ``TIMEOUT (minutes)``, ``SKIP (reason)``, ``XFAIL (reason)``, ``ISOLATION`` (see ``isolation.py``).
Waives files hold lines ``node_id SKIP (reason)`` (or ``XFAIL (reason)``) and ``#`` comments.

Nothing here touches a pytest session: ``selection.py`` applies a lane to one.
"""

from __future__ import annotations

import dataclasses
import fnmatch
from pathlib import Path
from typing import Any

import pytest
import yaml

KEYWORDS = ("TIMEOUT", "ISOLATION", "SKIP", "XFAIL")
BOUNDS = {"gte": lambda v, b: v >= b, "lte": lambda v, b: v <= b, "gt": lambda v, b: v > b, "lt": lambda v, b: v < b}
BOUND_TEXT = {"gte": ">=", "lte": "<=", "gt": ">", "lt": "<"}


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
    shown = rel_path(path, rootpath)
    try:
        data = yaml.safe_load(read_text(path, shown))
    except yaml.YAMLError as e:
        raise pytest.UsageError(f"lane file {yaml_where(e, shown)}: invalid YAML: {getattr(e, 'problem', None) or e}") \
            from None
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
        raise pytest.UsageError(f"--kvcm-lane=auto: no lane file (*.yml) in {rel_path(lane_dir, rootpath)}")
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
            f"--kvcm-lane=auto: none of the {len(files)} lane file(s) in {rel_path(lane_dir, rootpath)} has a block "
            f"matching this machine ({keys_text(keys)}): " + "; ".join(rejected)
        )
    return best, f"auto: most specific of {len(files)} lane file(s), {best_weight} key(s) matched"


def load_waives(path: Path, rootpath: Path | None = None) -> list[Entry]:
    shown = rel_path(path, rootpath)
    entries = []
    for n, line in enumerate(read_text(path, shown).splitlines(), start=1):
        entry = parse_entry(line, f"{shown}:{n}")
        if entry is None:
            continue
        if entry.isolation or entry.timeout_min is not None or not (entry.skip or entry.xfail):
            raise pytest.UsageError(f"{shown}:{n}: a waive is 'node_id SKIP (reason)' (or XFAIL (reason)); "
                                    f"given {line.strip()!r}")
        entries.append(entry)
    return entries


def read_text(path: Path, shown: str) -> str:
    """A lane, waive or reference file's text; a file that is not UTF-8 is a usage error naming it."""
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        line = path.read_bytes()[:e.start].count(b"\n") + 1
        raise pytest.UsageError(f"{shown}:{line}: not UTF-8 text (byte {e.start}: {e.reason})") from None
    except OSError as e:
        raise pytest.UsageError(f"{shown}: cannot read ({e.strerror})") from None


def yaml_where(error, shown: str) -> str:
    """``file:line`` of a YAML error (its problem mark is 0-based), or the file alone."""
    mark = getattr(error, "problem_mark", None)
    return f"{shown}:{mark.line + 1}" if mark is not None else shown


def rel_path(path: Path, rootpath: Path | None) -> str:
    """``path`` relative to rootdir when it is under it, for messages."""
    try:
        return str(path.resolve().relative_to(rootpath.resolve())) if rootpath else str(path)
    except ValueError:
        return str(path)


def keys_text(keys: dict[str, Any]) -> str:
    """The machine facts lane conditions usually test, for messages."""
    shown = ("system_gpu_count", "gpu", "gpu_memory_gb", "sm", "stage")
    return ", ".join(f"{k}={keys[k]!r}" for k in shown if k in keys)

