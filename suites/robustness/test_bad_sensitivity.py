"""``kvcm sensitivity`` with bad input: exit 2 and one line on stderr before the first pytest run; never
"every defect caught" from a lane that does not exist, and never a traceback after hours of runs.

Before, a missing lane ran the named catchers and reported every defect caught; an unbalanced quote in
``--pytest-args``, a bad ``KVCM_SENSITIVITY_JOBS`` or a ``--json`` directory was a traceback (the last after every
run); ``-x``, ``--junitxml`` or ``--kvcm-inject`` in the extra arguments quietly changed what was counted; an
unknown option or target failed every run instead of the command; ``--min-catchers 0`` passed every defect.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.cpu_only
ROOT = Path(__file__).resolve().parents[2]

CONFTEST = """
import probe_lib

def pytest_kvcm_register_defects(registry):
    def off_by_one(mp):
        mp.setattr(probe_lib, "pages", lambda tokens: tokens // 16)
    registry.register("off-by-one", "pages rounded down", off_by_one, upstream="tracker #1",
                      catchers=("test_probe.py::test_exact", "test_probe.py::test_partial"))
"""
PROBE = """
import probe_lib

def test_exact():
    assert probe_lib.pages(33) == 3

def test_partial():
    assert probe_lib.pages(1) == 1
"""


@pytest.fixture
def project(pytester):
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(probe_lib="def pages(tokens):\n    return -(-tokens // 16)\n", test_probe=PROBE)
    (pytester.path / "a_file").write_text("")
    return pytester.path


def _sensitivity(cwd: Path, args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if k not in ("PYTEST_ADDOPTS", "KVCM_SENSITIVITY_JOBS")}
    base["PYTHONPATH"] = f"{cwd}:{ROOT}:{os.environ.get('PYTHONPATH', '')}"
    code = "import sys; from pytest_kvcm.cli import main; sys.exit(main(['sensitivity', *sys.argv[1:]]))"
    return subprocess.run([sys.executable, "-c", code, *args], cwd=cwd, env={**base, **env}, capture_output=True,
                          text=True, timeout=300)


CASES = [  # (case id, arguments, environment, a fragment of the one line)
    ("lane_missing", ["--lane", "nope"], {}, "(--lane nope): --kvcm-lane=nope: no lane file ci/nope.yml"),
    ("args_unbalanced_quote", ["--pytest-args", "-m 'not slow"], {},
     "--pytest-args=\"-m 'not slow\": cannot be split into arguments (No closing quotation)"),
    ("args_exitfirst", ["--pytest-args", "-x"], {}, "--pytest-args='-x': -x cannot be used here: a run stopped at"),
    ("args_exitfirst_cluster", ["--pytest-args=-xq"], {}, "-xq cannot be used here"),
    ("args_maxfail", ["--pytest-args=--maxfail=1"], {}, "--maxfail=1 cannot be used here"),
    ("args_junitxml", ["--pytest-args=--junitxml=r.xml"], {}, "sensitivity reads its own JUnit report"),
    ("args_inject", ["--pytest-args=--kvcm-inject=off-by-one"], {}, "sensitivity injects each defect itself"),
    ("args_lane", ["--pytest-args=--kvcm-lane=l0_cpu"], {}, "--kvcm-lane=l0_cpu cannot be used here: give --lane"),
    ("args_collect_only", ["--pytest-args=--co"], {}, "--co cannot be used here: nothing would run"),
    ("args_unknown_option", ["--pytest-args=--no-such-option"], {},
     "pytest refuses the runs' options (--pytest-args '--no-such-option'): unrecognized arguments: --no-such-option"),
    ("args_bad_plugin_value", ["--pytest-args=--kvcm-gsm8k-limit=0"], {}, "--kvcm-gsm8k-limit=0: must be >= 1"),
    ("target_unknown", ["--target", "nope"], {}, "--kvcm-target='nope': unknown target(s) nope"),
    ("json_a_directory", ["--json", "."], {}, "--json .: is a directory; give a file's path"),
    ("json_under_a_file", ["--json", "a_file/t.json"], {}, "--json a_file/t.json: cannot be created: a_file is a file"),
    ("min_catchers_zero", ["--min-catchers", "0"], {}, "--min-catchers=0: must be an integer >= 1"),
    ("min_catchers_negative", ["--min-catchers", "-1"], {}, "--min-catchers=-1: must be an integer >= 1"),
    ("jobs_zero", ["--jobs", "0"], {}, "--jobs=0: must be >= 1 (pytest runs at once)"),
    ("jobs_env_text", [], {"KVCM_SENSITIVITY_JOBS": "abc"}, "KVCM_SENSITIVITY_JOBS='abc': must be an integer >= 1"),
    ("jobs_env_zero", [], {"KVCM_SENSITIVITY_JOBS": "0"}, "KVCM_SENSITIVITY_JOBS=0: must be >= 1"),
    ("addopts_exitfirst", [], {"PYTEST_ADDOPTS": "-x"}, "PYTEST_ADDOPTS='-x': -x cannot be used here"),
    ("addopts_unbalanced", [], {"PYTEST_ADDOPTS": "-k 'a"}, "PYTEST_ADDOPTS=\"-k 'a\": cannot be split"),
    ("defect_unknown", ["--defect", "nope"], {}, "unknown defect(s) nope; registered: "),
    ("json_over_a_file_it_did_not_write", ["--json", "probe_lib.py"], {},
     "--json probe_lib.py: exists and was not written by this command; it is never replaced"),
]


@pytest.mark.parametrize("args, env, fragment", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_stops_before_the_first_run(project, args, env, fragment):
    only = [] if "--defect" in args else ["--defect", "off-by-one"]  # had the check missed, two short runs
    proc = _sensitivity(project, [*args, *only], env)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stdout == "" and "runs of lane" not in proc.stderr  # no run started
    assert proc.stderr.startswith("kvcm sensitivity: ") and proc.stderr.count("\n") == 1, proc.stderr
    assert fragment in proc.stderr
    assert not list(project.glob("*.json"))
