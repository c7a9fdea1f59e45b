"""``kvcm sensitivity`` runs the contract suites on the user's manager (issue 28.3): a defect registered with
``targets=("mine",)`` runs on ``--kvcm-target=mine`` and is caught; ``--target`` overrides it (on kvcm V2 the
adapter's bug is absent, so it goes uncaught, which is how one sees the option is what decides)."""

import re
import subprocess
import sys

import pytest

from test_targets import README_ADAPTER_LEAK, readme_adapter

pytestmark = [pytest.mark.cpu_only, pytest.mark.slow]  # six pytest processes: 42-58 s on the shared 2-core machine


def sensitivity(cwd, *args):
    code = "import sys; from pytest_kvcm.cli import main; sys.exit(main(['sensitivity', *sys.argv[1:]]))"
    return subprocess.run([sys.executable, "-c", code, "--defect", "my-leak", "--pytest-args=--pyargs", *args],
                          cwd=cwd, capture_output=True, text=True, timeout=300)


def test_sensitivity_runs_the_defects_own_target_and_takes_target(pytester):
    pytester.makeconftest(readme_adapter() + README_ADAPTER_LEAK)
    proc = sensitivity(pytester.path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert re.search(r"my-leak \(caught by 2 failed test\(s\) in .*; ran its named catchers, --kvcm-target=mine,", proc.stdout), \
        proc.stdout
    proc = sensitivity(pytester.path, "--target", "kvcm-v2")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "my-leak (UNCAUGHT; ran its named catchers, --kvcm-target=kvcm-v2," in proc.stdout, proc.stdout
