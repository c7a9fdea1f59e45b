"""ARCHITECTURE.md's module map stays in step with the files (issue 52): every path it names exists, and every module
of ``kvcm`` and ``pytest_kvcm`` is named there or lies in a folder it names.

Before, the map named ``reuse/policy.py`` a release after it became ``reuse/version_rules.py``, and left out
``free_queue.py``, ``plan_host_tier.py`` and ``release_matrix.py``.

The map is the first code block: a top folder at the margin (``kvcm/``), its entries indented two spaces, each
entry's names (comma-separated, a folder ending in ``/``) before the description, which may go on over deeper
indented lines. A ``.py`` name in a description is a path too: under the entry's folder, its top folder or the
repository root.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("kvcm", "pytest_kvcm")
PY_NAME = re.compile(r"(?<![\w/.])([\w/]+\.py)\b")


def module_map(text: str) -> list[tuple[str, list[str], str]]:
    """(top folder, the entry's names, its description with continuations) for each entry of the map; a top
    folder's own line is an entry whose names are empty."""
    block = text.split("```", 2)[1].split("\n", 1)[1]
    entries: list[tuple[str, list[str], str]] = []
    top = ""
    for line in block.splitlines():
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip())
        head, _, rest = line.strip().partition("  ")
        if indent == 0:
            top = head
            entries.append((top, [], rest))
        elif indent == 2:
            entries.append((top, [n.strip() for n in head.split(",")], rest))
        else:                                             # a description going on
            t, names, desc = entries[-1]
            entries[-1] = (t, names, f"{desc} {line.strip()}")
    return entries


def _resolve(name: str, top: str, folders: list[str]) -> Path | None:
    for base in [ROOT / top / f for f in folders] + [ROOT / top, ROOT]:
        if (base / name).exists():
            return base / name
    return None


def check(text: str) -> tuple[list[str], set[Path]]:
    """Problems (a path that is not there), and every path the map names or covers."""
    problems, covered = [], set()
    for top, names, desc in module_map(text):
        if not names:
            covered.add(ROOT / top)
        folders = [n for n in names if n.endswith("/")]
        for name in names:
            path = ROOT / top / name
            if not path.exists():
                problems.append(f"{top}{name} is in the map and not in the repository")
            covered.add(path)
        for name in PY_NAME.findall(desc):
            path = _resolve(name, top, folders)
            if path is None:
                problems.append(f"{top} {', '.join(names) or '(its own line)'}: its description names {name}, "
                                "which is not there")
            else:
                covered.add(path)
    return problems, covered


def _covered(path: Path, covered: set[Path], tops: set[Path]) -> bool:
    """Named, or inside a named folder other than a top folder itself."""
    return path in covered or any(folder in path.parents for folder in covered - tops if folder.is_dir())


def test_the_module_map_names_only_what_is_there_and_everything_that_is():
    text = (ROOT / "ARCHITECTURE.md").read_text()
    problems, covered = check(text)
    tops = {ROOT / top for top, names, _ in module_map(text) if not names}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if path.name != "__init__.py" and not _covered(path, covered, tops):
                problems.append(f"{path.relative_to(ROOT)} is not in ARCHITECTURE.md's module map")
    assert not problems, "\n".join(problems)


def test_the_check_finds_a_renamed_and_a_missing_module():
    text = ("```\nkvcm/   the library\n  limits.py    Limits\n  reuse/       matching (policy.py)\n"
            "  gone.py      a module renamed\n```\n")
    problems, covered = check(text)
    assert problems == ["kvcm/ reuse/: its description names policy.py, which is not there",
                        "kvcm/gone.py is in the map and not in the repository"], problems
    tops = {ROOT / "kvcm"}
    assert _covered(ROOT / "kvcm" / "reuse" / "tree.py", covered, tops)
    assert not _covered(ROOT / "kvcm" / "free_queue.py", covered, tops)


def test_the_benchmarks_version_options_are_as_the_naming_section_says():
    """The naming section says which benchmarks take one version (``--kvcm-version``) and which several
    (``--kvcm-versions``); each is checked against the benchmark's own parser."""
    text = (ROOT / "ARCHITECTURE.md").read_text()
    for option, scripts in (("--kvcm-version", ("throughput.py",)),
                            ("--kvcm-versions", ("fewshot.py", "host_step.py", "host_tier.py"))):
        for script in scripts:
            assert f'add_argument("{option}"' in (ROOT / "benchmarks" / script).read_text(), (option, script)
            assert f"`{script}`" in text, f"ARCHITECTURE.md does not say {script} takes {option}"
