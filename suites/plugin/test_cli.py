"""Layering: the ``kvcm`` library never imports the plugin; its plugin commands are lazy aliases of ``pytest-kvcm``."""

import subprocess
import sys

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
print("\\n".join(sorted(m for m in sys.modules if m.startswith("pytest_kvcm"))))
"""


def test_importing_every_kvcm_module_loads_no_plugin_module():
    proc = subprocess.run([sys.executable, "-c", IMPORT_ALL], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "pytest_kvcm" not in proc.stdout, proc.stdout


def test_kvcm_dashboard_is_an_alias_of_the_plugin_command(tmp_path, capsys):
    missing = tmp_path / "none.sqlite"
    assert kvcm.cli.main(["dashboard", "--results", str(missing), "--out", str(tmp_path / "d.html")]) == 2
    via_alias = capsys.readouterr().err
    assert pytest_kvcm.cli.main(["dashboard", "--results", str(missing), "--out", str(tmp_path / "d.html")]) == 2
    assert str(missing) in via_alias and via_alias.startswith("kvcm dashboard:")
    assert capsys.readouterr().err.startswith("pytest-kvcm dashboard:")


def test_plugin_alias_says_what_to_install_when_the_plugin_is_missing(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "pytest_kvcm.cli", None)  # import of it now raises ImportError
    assert kvcm.cli.main(["sensitivity", "--lane", "l0_cpu"]) == 2
    err = capsys.readouterr().err
    assert "kvcm sensitivity" in err and "pip install" in err


def test_plugin_command_names_its_subcommands(capsys):
    with pytest.raises(SystemExit):
        pytest_kvcm.cli.main(["nonsense"])
    assert "sensitivity" in capsys.readouterr().err
