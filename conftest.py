"""Root conftest: the plugin comes through its entry point (or ``-p pytest_kvcm.plugin``, which inner runs then
inherit: ``pytest_kvcm/loading.py``); ``pytester`` drives the plugin self-tests.

torch and kvcm are imported here, before any in-process pytester run takes its ``sys.modules`` snapshot:
pytester drops modules first imported inside a run, and importing torch a second time in one process crashes.
"""

import os
import sys

import pytest
import torch  # noqa: F401

import kvcm

for _name in kvcm.__all__:  # kvcm loads its modules on first use; load every public one now
    getattr(kvcm, _name)

pytest_plugins = ["pytester"]


def pytest_configure(config):
    config.addinivalue_line("markers", "upstream(*tests, differs=None): a conformance case ports these upstream tests; "
                            "differs names the docs/semantics.md section 10 row by which its numbers differ "
                            "(suites/plugin/test_conformance_citations.py)")
    _codeblocks(config)


def _codeblocks(config):
    """README.md's and docs/*.md's code blocks run as tests (pytest-codeblocks, the test extra; both are in testpaths).

    Switched on here rather than by ``--codeblocks`` in addopts, so a machine without the plugin (a GPU image
    running its lane) still parses the command line. Their shell commands (``kvcm plan``) come from this
    interpreter's environment even when it was not activated (``.venv/bin/pytest``), as its own scripts would.
    """
    if hasattr(config.option, "codeblocks"):
        config.option.codeblocks = True
        scripts = os.path.dirname(sys.executable)
        if scripts not in os.environ.get("PATH", "").split(os.pathsep):
            os.environ["PATH"] = scripts + os.pathsep + os.environ.get("PATH", "")


_WORKER_SECTIONS: dict[str, list[str]] = {}


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    """An xdist worker's summary sections (``workeroutput["kvcm_sections"]``, title -> lines: the explorer's
    ``... N distinct states ...`` lines), kept for the controller's summary: a worker's terminal is not shown."""
    for title, lines in getattr(node, "workeroutput", {}).get("kvcm_sections", {}).items():
        _WORKER_SECTIONS.setdefault(title, []).extend(lines)


def pytest_terminal_summary(terminalreporter):
    for title, lines in _WORKER_SECTIONS.items():
        terminalreporter.section(title)
        for line in lines:
            terminalreporter.write_line(line)
