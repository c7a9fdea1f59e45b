"""The engine uses a manager only through the declared contract (``kvcm/protocols.py``), and imports no manager.

No type checker runs in CI, so the engine's code is scanned instead: every attribute read or written on a
manager (a name ``mgr`` / ``manager``, as the engine calls them, however reached: ``self.mgr``, ``runner.mgr``,
``getattr(mgr, "...")``) must be a member of ``ReuseManager`` (the step contract plus reuse), and no member is
ever assigned from the engine (a manager keeps its own figures: before, ``page_usage.py`` reset
``pool.peak_held`` and ``manager.stale_released`` itself).
"""

from __future__ import annotations

import ast
from pathlib import Path

from kvcm.protocols import ReuseManager, StepManager, missing_members

ENGINE = Path(__file__).resolve().parents[2] / "kvcm" / "engine"
MANAGER_NAMES = {"mgr", "manager"}
MANAGER_MODULES = {"manager", "manager_v1", "manager_v2", "deepseek_v4", "block_pool"}


def _names_a_manager(node) -> bool:
    return (isinstance(node, ast.Name) and node.id in MANAGER_NAMES) or (
        isinstance(node, ast.Attribute) and node.attr in MANAGER_NAMES)


def manager_uses(source: str) -> tuple[set[str], set[str]]:
    """(members read or called, members assigned) on a manager in ``source``."""
    used, written = set(), set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and _names_a_manager(node.value):
            (written if isinstance(node.ctx, (ast.Store, ast.Del)) else used).add(node.attr)
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
              and node.func.id in ("getattr", "hasattr", "setattr") and len(node.args) >= 2
              and _names_a_manager(node.args[0]) and isinstance(node.args[1], ast.Constant)):
            (written if node.func.id == "setattr" else used).add(node.args[1].value)
    return used, written


def _members(protocol) -> set[str]:
    class Nothing:
        pass
    return set(missing_members(Nothing(), protocol))


def test_the_scan_sees_reads_writes_and_getattr():
    used, written = manager_uses("def f(self, mgr):\n    self.mgr.pools\n    getattr(mgr, 'x', 0)\n"
                                 "    runner.mgr.begin_generation(1)\n    mgr.stale_released = []\n")
    assert used == {"pools", "x", "begin_generation"} and written == {"stale_released"}


def test_the_engine_uses_only_members_of_the_contract():
    contract = _members(ReuseManager)
    assert _members(StepManager) < contract
    outside, writes = {}, {}
    for path in sorted(ENGINE.glob("*.py")):
        used, written = manager_uses(path.read_text())
        if used - contract:
            outside[path.name] = sorted(used - contract)
        if written:
            writes[path.name] = sorted(written)
    assert not outside, f"declare these in kvcm/protocols.py or stop using them: {outside}"
    assert not writes, f"the engine writes a manager's fields; give the manager a method instead: {writes}"


def test_the_engine_imports_no_manager_class():
    imported = []
    for path in sorted(ENGINE.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 2:     # from ..X import ...
                module = (node.module or "").split(".")[0]
                if module in MANAGER_MODULES:
                    imported.append(f"{path.name}: from ..{node.module}")
    assert not imported, imported
