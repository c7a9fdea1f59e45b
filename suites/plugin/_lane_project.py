"""A small project for the lane tests: suites/a, suites/b and a ci/ dir, run by an inner pytest session (the
``project`` fixture that writes it is in this directory's conftest.py).

Most lane tests drive a real inner pytest session (``pytester``) over this project, with the machine simulated
through ``--kvcm-machine``; only ISOLATION needs real subprocesses.
"""

from __future__ import annotations

import json

import pytest

H100 = json.dumps({"gpu_count": 8, "gpu_name": "NVIDIA H100 80GB HBM3", "gpu_memory_gb": 85, "sm": 90})
H200 = json.dumps({"gpu_count": 8, "gpu_name": "NVIDIA H200", "gpu_memory_gb": 143.8, "sm": 90})
CPU = json.dumps({})

TESTS_A = """
    import pytest
    def test_one(): pass
    def test_two(): pass
    @pytest.mark.parametrize("p", [1, 2])
    def test_p(p): pass
"""
TESTS_B = """
    def test_three(): pass
    def test_four(): pass
"""


def run(pytester: pytest.Pytester, *args: str, machine: str = CPU) -> pytest.RunResult:
    # no:hypothesispytest: its terminal summary re-imports hypothesis in every in-process run (3 s each here)
    return pytester.runpytest_inprocess("-p", "no:hypothesispytest", "--kvcm-machine", machine, *args)


def order_of(result: pytest.RunResult) -> list[str]:
    return [line.split()[0] for line in result.outlines if " PASSED" in line or " SKIPPED" in line
            or " XFAIL" in line or " FAILED" in line or " XPASS" in line]
