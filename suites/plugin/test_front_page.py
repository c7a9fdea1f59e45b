"""The README is a front page a newcomer can follow (issue 42.3 and 42.4): its set-up is what ``.ci/run``
installs on a clean clone, it stays short, and every document it sends the reader to exists."""

import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.cpu_only

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
INSTALL = re.compile(r"^(?:python -m |python3 -m )?pip install (?:-q )?(.*?)\s*(?:#.*)?$")


def _installs(lines) -> list[str]:
    """What each ``pip install`` (or ``python -m pip install -q``) line installs, and every ``bash ci/...`` step."""
    out = []
    for line in lines:
        line = line.strip()
        if m := INSTALL.match(line):
            out.append(m.group(1).strip())
        elif line.startswith("bash ci/"):
            out.append(line.split("#")[0].strip())
    return out


def _readme_setup() -> list[str]:
    start = README.index("```bash", README.index("## Set-up"))
    return README[start:README.index("```\n", start + 7)].splitlines()


def test_readme_setup_installs_what_ci_installs():
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    ci = ci[:next(i for i, line in enumerate(ci) if line.startswith("kvcm plan"))]  # the set-up, before the jobs
    assert _installs(_readme_setup()) == _installs(ci)


def test_readme_is_a_front_page():
    lines = README.count("\n")
    assert lines <= 300, f"README.md has {lines} lines; move depth into docs/<topic>.md"


def test_every_document_the_readme_names_exists():
    named = set(re.findall(r"`((?:docs/)?[\w.-]+\.md)`", README))
    missing = sorted(n for n in named if not (ROOT / n).is_file())
    assert named and not missing, f"README.md names {missing}"
