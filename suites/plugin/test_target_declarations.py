"""A built-in target is declared once (``pytest_kvcm/targets/declared.py``); everything that lists targets reads it.

Before, a target's name, adapter, release and venv were written in seven places (the registry, the plugin's
help and default, the package docstring, the docs, a venv script, ``.ci/run``), and the SGLang release in seven
files: a bump missed one of them.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from pytest_kvcm.options import TARGETS_DEFAULT
from pytest_kvcm.targets import BUILTIN_TARGETS
from pytest_kvcm.targets.declared import BY_NAME, TARGETS, docs_table

ROOT = Path(__file__).resolve().parents[2]
DECLARED = ROOT / "pytest_kvcm" / "targets" / "declared.py"


def test_the_registry_and_the_default_are_the_declared_targets():
    assert list(BUILTIN_TARGETS) == [t.name for t in TARGETS]
    assert TARGETS_DEFAULT.split(",") == [t.name for t in TARGETS if t.default]
    assert all(t.venv_script is None or (ROOT / t.venv_script).is_file() for t in TARGETS)


def test_the_docs_table_is_the_declaration():
    text = (ROOT / "docs" / "contract.md").read_text()
    table = docs_table()
    start = text.index(table[0])
    assert text[start:].splitlines()[:len(table)] == table


def test_the_sglang_release_is_written_in_the_declaration_and_the_docs_table_only():
    """(vLLM's release is also named by the release matrix and its findings, which compare releases on purpose.)"""
    version = re.escape(BY_NAME["sglang"].version)
    found = subprocess.run(["git", "grep", "-l", "-E", rf"\b{version}\b", "--", "."], cwd=ROOT,
                           capture_output=True, text=True).stdout.split()
    if found:   # else not a git checkout (an unpacked sdist): nothing to compare
        assert set(found) <= {"pytest_kvcm/targets/declared.py", "docs/contract.md"}, found


def test_the_venv_scripts_and_ci_read_the_declaration():
    sglang = subprocess.run([sys.executable, str(DECLARED), "sglang"], capture_output=True, text=True)
    assert sglang.returncode == 0 and sglang.stdout.strip() == BY_NAME["sglang"].release
    listed = subprocess.run([sys.executable, str(DECLARED), "--with-venv"], capture_output=True, text=True)
    assert listed.stdout.split() == [f"{t.name}:{t.venv_script}" for t in TARGETS if t.venv_script]
    bad = subprocess.run([sys.executable, str(DECLARED), "hf"], capture_output=True, text=True)
    assert bad.returncode == 2 and "give a pinned target (vllm, sglang, hf-5.17)" in bad.stderr and not bad.stdout
    assert "declared.py --with-venv" in (ROOT / ".ci" / "run").read_text()
    for t in TARGETS:
        if t.venv_script:
            assert f'declared.py" {t.name})' in (ROOT / t.venv_script).read_text()
