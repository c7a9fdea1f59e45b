"""The README's recipe for a manager's maintainer, run as they would (issue 27.3): the wheel built from this
checkout, installed into a directory of its own, and pytest started in a new project directory outside the
checkout holding only the README's adapter as ``conftest.py``. The contract suites come from the wheel
(``--pyargs pytest_kvcm.contract``); a broken adapter is one usage error. .ci/run runs it every run."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from test_targets import readme_adapter

pytestmark = pytest.mark.cpu_only
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def wheel_site(tmp_path_factory):
    """The wheel, built without build isolation (no registry), installed with --target into a fresh folder."""
    tmp = tmp_path_factory.mktemp("wheel")
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                            "-w", str(tmp / "dist"), str(ROOT)], capture_output=True, text=True, timeout=300)
    if "invalid command 'bdist_wheel'" in build.stdout + build.stderr:
        pytest.skip("this setuptools builds no wheels without the 'wheel' package: pip install wheel (.ci/run does)")
    assert build.returncode == 0, build.stdout + build.stderr
    (whl,) = (tmp / "dist").glob("pytest_kvcm-*.whl")
    inst = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(tmp / "site"),
                           str(whl)], capture_output=True, text=True, timeout=300)
    assert inst.returncode == 0, inst.stdout + inst.stderr
    return tmp / "site"


def run_in_project(project, site, *args):
    # the wheel's copy first on the path; the plugin named once (autoload off: this venv's editable install also
    # declares the entry point)
    env = dict(os.environ, PYTHONPATH=str(site), PYTEST_DISABLE_PLUGIN_AUTOLOAD="1")
    env.pop("PYTEST_ADDOPTS", None)
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "pytest_kvcm.plugin", "-p", "no:cacheprovider",
                           "--kvcm-target=mine", "--pyargs", "pytest_kvcm.contract", "-ra", "-q", *args],
                          cwd=project, env=env, capture_output=True, text=True, timeout=300)


def test_readme_recipe_from_outside_the_checkout(wheel_site, tmp_path):
    project = tmp_path / "my-manager"
    project.mkdir()
    assert ROOT not in project.parents
    (project / "conftest.py").write_text(readme_adapter())
    proc = run_in_project(project, wheel_site)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert f"{wheel_site.parent.name}/site/pytest_kvcm/contract/" in out, out  # the wheel's suites (its skip lines), not the checkout's
    assert " passed" in out.splitlines()[-1] and "failed" not in out.splitlines()[-1], out

    (project / "conftest.py").write_text(readme_adapter().replace('return {"full": len(self.tables[rid])}', "pass"))
    proc = run_in_project(project, wheel_site)
    assert proc.returncode == pytest.ExitCode.USAGE_ERROR, proc.stdout + proc.stderr
    assert "--kvcm-target=mine: adapter MyTarget, held_pages: held_pages must return a dict" in proc.stderr
