"""Layering: the ``kvcm`` library never imports the plugin; ``kvcm sensitivity`` and ``kvcm dashboard`` are the
plugin's commands, found through the ``kvcm.commands`` entry-point group the plugin registers."""

import subprocess
import sys
from importlib.metadata import PackageNotFoundError, distribution

import pytest

import kvcm.cli
import pytest_kvcm.cli

IMPORT_ALL = """
import importlib, pkgutil, sys
import kvcm
for m in pkgutil.walk_packages(kvcm.__path__, "kvcm."):
    try:
        importlib.import_module(m.name)
    except ImportError as exc:   # an optional dependency (triton) may be missing; the module must say so
        print("skipped", m.name, exc)
print("\\n".join(sorted(m for m in sys.modules if m.split(".")[0] in ("pytest_kvcm", "pytest", "_pytest"))))
"""


def _installed() -> bool:
    try:
        distribution("pytest-kvcm")
    except PackageNotFoundError:
        return False
    return True


# Entry points exist only in an installed package's metadata; a checkout run through PYTHONPATH (the GPU lane's
# machine, ci/gpu_lane.sh) has the code but no dist-info, so these tests have nothing to check there.
needs_install = pytest.mark.skipif(
    not _installed(), reason="pytest-kvcm is not installed (run from a checkout through PYTHONPATH): its "
    "kvcm.commands entry points exist only once installed (pip install -e .)")


def test_importing_every_kvcm_module_loads_no_plugin_module_and_no_pytest():
    """Test support that needs pytest (a skip when a model is not installed) lives in ``pytest_kvcm.models``."""
    proc = subprocess.run([sys.executable, "-c", IMPORT_ALL], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "pytest" not in proc.stdout, proc.stdout


@needs_install
def test_kvcm_dashboard_is_an_alias_of_the_plugin_command(tmp_path, capsys):
    missing = tmp_path / "none.sqlite"
    assert kvcm.cli.main(["dashboard", "--results", str(missing), "--out", str(tmp_path / "d.html")]) == 2
    via_alias = capsys.readouterr().err
    assert pytest_kvcm.cli.main(["dashboard", "--results", str(missing), "--out", str(tmp_path / "d.html")]) == 2
    assert str(missing) in via_alias and via_alias.startswith("kvcm dashboard:")
    assert capsys.readouterr().err.startswith("pytest-kvcm dashboard:")


@needs_install
def test_the_plugin_registers_its_commands_with_kvcm():
    commands = kvcm.cli.registered_commands()
    assert {"sensitivity", "dashboard"} <= set(commands), (
        "pytest-kvcm's kvcm.commands entry points are not installed (reinstall the package: pip install -e .)")
    assert commands["sensitivity"].load() is pytest_kvcm.cli.sensitivity_command
    assert commands["dashboard"].load() is pytest_kvcm.cli.dashboard_command


def test_a_command_no_package_registers_says_what_to_install(monkeypatch, capsys):
    monkeypatch.setattr(kvcm.cli, "registered_commands", lambda: {})   # as without the plugin installed
    assert kvcm.cli.main(["sensitivity", "--lane", "l0_cpu"]) == 2
    err = capsys.readouterr().err
    assert "'sensitivity'" in err and "pytest-kvcm is not on PyPI: pip install -e '.[test]' in a checkout" in err
    assert "python -m pytest_kvcm.cli COMMAND" in err and "pip install 'pytest-kvcm" not in err


def test_a_registered_command_that_cannot_import_says_so(monkeypatch, capsys):
    class Broken:
        name, value, dist = "sensitivity", "absent_module:main", None

        def load(self):
            raise ImportError("No module named 'absent_module'")
    monkeypatch.setattr(kvcm.cli, "registered_commands", lambda: {"sensitivity": Broken()})
    assert kvcm.cli.main(["sensitivity"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("kvcm sensitivity:") and "absent_module" in err and "pip install" in err


def test_plugin_command_names_its_subcommands(capsys):
    with pytest.raises(SystemExit):
        pytest_kvcm.cli.main(["nonsense"])
    assert "sensitivity" in capsys.readouterr().err
