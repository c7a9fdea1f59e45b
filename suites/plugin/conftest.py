"""Fixtures of the plugin's own tests: ``project``, the lane tests' small project (``_lane_project.py``)."""

from __future__ import annotations

import textwrap

import pytest

from _lane_project import TESTS_A, TESTS_B


@pytest.fixture
def project(pytester: pytest.Pytester):
    """A rootdir with suites/a/test_a.py, suites/b/test_b.py and a ci/ dir; returns a lane writer."""
    pytester.makeini("[pytest]\naddopts = -p no:cacheprovider\n")
    pytester.mkdir("suites")
    for name, body in (("a", TESTS_A), ("b", TESTS_B)):
        pytester.mkdir(f"suites/{name}")
        (pytester.path / f"suites/{name}/test_{name}.py").write_text(textwrap.dedent(body))
    pytester.mkdir("ci")

    def write_lane(name: str, body: str) -> None:
        (pytester.path / "ci" / f"{name}.yml").write_text(textwrap.dedent(body))

    return write_lane
