"""The plugin reaches inner pytest runs whether it came from its entry point or from ``-p pytest_kvcm.plugin``.

The project-only-on-PYTHONPATH case is simulated with ``PYTEST_DISABLE_PLUGIN_AUTOLOAD=1``: pytest then loads
no entry point, exactly as when the project is not installed. Before ``loading.py`` the inner runs below saw no
plugin (``unrecognized arguments: --kvcm-lane``), as a lane self-test did on the H200.
"""

import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

import pytest_kvcm

ROOT = Path(pytest_kvcm.__file__).resolve().parent.parent

INNER = '''
import subprocess, sys

def test_inprocess_run_has_the_plugin(pytester):
    pytester.makepyfile(test_v="def test_v(kvcm_version): pass")
    result = pytester.runpytest_inprocess("--kvcm-version=both", "--collect-only", "-q")
    result.stdout.fnmatch_lines(["test_v.py::test_v[[]v1[]]", "test_v.py::test_v[[]v2[]]"])

def test_subprocess_run_has_the_plugin():
    proc = subprocess.run([sys.executable, "-m", "pytest", "--kvcm-list-defects", "-q"], capture_output=True,
                          text=True)
    assert proc.returncode == 0, proc.stderr
'''


def _env(**extra):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTEST_PLUGINS", "PYTEST_ADDOPTS")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return {**env, **extra}


def test_inner_runs_load_the_plugin_when_it_came_from_dash_p(tmp_path):
    (tmp_path / "test_inner.py").write_text(INNER)
    (tmp_path / "pytest.ini").write_text("[pytest]\naddopts = -p no:cacheprovider\n")
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "pytest_kvcm.plugin", "-p", "pytester", "-q",
                           str(tmp_path / "test_inner.py")], cwd=tmp_path, capture_output=True, text=True,
                          env=_env(PYTEST_DISABLE_PLUGIN_AUTOLOAD="1"), timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "2 passed" in proc.stdout


@pytest.mark.post_merge
def test_dash_p_on_an_installed_plugin_registers_it_once(tmp_path):
    names = [ep.name for ep in metadata.entry_points(group="pytest11") if ep.value == "pytest_kvcm.plugin"]
    if names != ["pytest_kvcm.plugin"]:
        pytest.skip(f"the installed entry point is named {names or 'nothing'} (an install older than this "
                    "checkout, or none): reinstall to check this")
    (tmp_path / "test_v.py").write_text("def test_v(kvcm_version): pass\n")
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "pytest_kvcm.plugin", "--kvcm-version=both", "-q",
                           "-p", "no:cacheprovider", str(tmp_path / "test_v.py")], cwd=tmp_path,
                          capture_output=True, text=True, env=_env(), timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "2 passed" in proc.stdout


@pytest.mark.post_merge     # the pre-merge run collects itself; this checks both stages' collections after a merge
@pytest.mark.parametrize("selection", [[], ["--kvcm-stage=post_merge"]], ids=["pre_merge", "post_merge"])
def test_the_whole_project_collects_as_ci_runs_it(selection):
    """Every collection hook meets every item kind: a hook in a suite's ``conftest.py`` sees README and docs code
    blocks too (no ``originalname``), and one such hook once stopped CI at collection with an INTERNALERROR."""
    proc = subprocess.run([sys.executable, "-m", "pytest", "--kvcm-version=both", "--collect-only", "-q",
                           "-p", "no:cacheprovider", *selection], cwd=ROOT, capture_output=True, text=True,
                          env=_env(), timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "INTERNALERROR" not in proc.stdout + proc.stderr
