"""What one of ``kvcm sensitivity``'s pytest runs did to each test, read back from its JUnit report.

A test *caught* a defect only when a check of it failed: JUnit's ``failure`` (an assertion, or the code under test
raising in the test's body). An ``error`` is *broken*, not a catch: a fixture or set-up that raised, a module that
could not be imported, a worker that could not be handed the defect; the test never got to check anything. A
``failure`` that is a time-out (pytest-timeout's ``Failed: Timeout >Ns``) is broken too: the test was stopped, it
did not fail a check. So a defect whose catchers all errored is not caught, whatever the exit status says.

Each test is named by its module (``module::test[params]``, the ``kvcm_id`` property that
``pytest_kvcm.sensitivity`` records), and the declared differences that skipped or relaxed it (the
``kvcm_relaxed`` properties of ``pytest_kvcm/targets/differences.py``) come back with it, so a defect left
uncaught because a declaration skipped its catchers says so.
"""

from __future__ import annotations

import ast
import re
import xml.etree.ElementTree as ET
from pathlib import Path

ID_PROPERTY = "kvcm_id"
RELAXED_PROPERTY = "kvcm_relaxed"   # differences.RELAXED, not imported: this module reads files, nothing else
_TIMEOUT = re.compile(r"^Failed: Timeout\b")


def _test_id(case) -> str:
    named = case.find(f"properties/property[@name='{ID_PROPERTY}']")
    return named.get("value") if named is not None else f"{case.get('classname', '')}::{case.get('name', '')}"


def _declared(case) -> list[str]:
    """The relaxations on a test case: ``"<target> differs on <key>: <how>"`` each."""
    out = []
    for prop in case.findall(f"properties/property[@name='{RELAXED_PROPERTY}']"):
        try:
            entry = ast.literal_eval(prop.get("value", ""))[0]   # [entry, test id], written as a Python list
        except (ValueError, SyntaxError, IndexError, TypeError):
            continue
        out.append(str(entry))
    return out


def read(junit_path: Path) -> dict:
    """``{"tests": n, "caught_by": [ids that failed a check], "broken": [{"test", "why"}], "declared":
    {id: [relaxations]}}``; a report that was never written reads as no test run."""
    out = {"tests": 0, "caught_by": [], "broken": [], "declared": {}}
    if not Path(junit_path).exists():
        return out
    for case in ET.parse(junit_path).getroot().iter("testcase"):
        out["tests"] += 1
        test, failure, error = _test_id(case), case.find("failure"), case.find("error")
        if error is not None or (failure is not None and _TIMEOUT.match(failure.get("message", ""))):
            why = (error if error is not None else failure).get("message", "") or "error"
            out["broken"].append({"test": test, "why": why.splitlines()[0][:300]})
        elif failure is not None:
            out["caught_by"].append(test)
        declared = _declared(case)
        if declared:
            out["declared"][test] = declared
    return out


def failed_tests(junit_path: Path) -> tuple[int, list[str]]:
    """(tests run, ids of the tests that failed a check): errors are not among them (``read`` has those)."""
    outcome = read(junit_path)
    return outcome["tests"], outcome["caught_by"]


def declared_keys(declared: dict[str, list[str]]) -> dict[str, dict[str, int]]:
    """``{"skipped" | "relaxed": {key: tests}}`` from ``read``'s ``declared``: what the declarations did."""
    out: dict[str, dict[str, int]] = {"skipped": {}, "relaxed": {}}
    for entries in declared.values():
        for entry in dict.fromkeys(entries):
            head, _, how = entry.partition(": ")
            key = head.rpartition(" differs on ")[2] or head
            kind = "skipped" if how.startswith("skipped") else "relaxed"
            out[kind][key] = out[kind].get(key, 0) + 1
    return out
