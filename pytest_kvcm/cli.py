"""The ``pytest-kvcm`` command: the plugin's own tools, kept out of the ``kvcm`` library.

* ``sensitivity``: run a lane once clean and once per registered defect; fail if one goes uncaught.
* ``dashboard``: render the results store as one HTML file.

The plugin registers both as ``kvcm`` commands too (the ``kvcm.commands`` entry-point group of pyproject.toml:
:func:`sensitivity_command`, :func:`dashboard_command`), so the library finds them without importing the plugin.
"""

from __future__ import annotations

import argparse
import sys


def _sensitivity_parser(prog: str) -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog=prog, description="Run a lane once per registered defect; fail if one is "
                                 "missed.")
    ap.add_argument("--lane", default="l0_cpu", help="the lane (ci/LANE.yml) to run (default: l0_cpu)")
    ap.add_argument("--defect", action="append", default=None,
                    help="only these defects (repeatable; default: every registered one)")
    ap.add_argument("--target", default=None, metavar="NAMES",
                    help="managers the contract suites run on in every run (--kvcm-target): e.g. your adapter's "
                         "name (default: the targets the defect names, else the session's kvcm_target)")
    ap.add_argument("--pytest-args", default="", help="extra arguments for every pytest run (default: none)")
    ap.add_argument("--json", default=None, help="also write the table as JSON to this file (default: no file)")
    ap.add_argument("--mode", choices=("fast", "full"), default="fast",
                    help="fast: each defect runs the tests it names as catchers (a defect naming none runs the "
                         "lane); full: the whole lane per defect, also reporting unnamed catchers (default: fast)")
    ap.add_argument("--min-catchers", type=int, default=2,
                    help="tests that must fail for a defect to count as caught (default: 2)")
    return ap


def main(argv: list[str] | None = None, prog: str = "pytest-kvcm") -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    commands = {"sensitivity": "run the lane once per registered defect; fail if one is missed",
                "dashboard": "render the accuracy dashboard from the results store"}
    if not argv or argv[0] not in commands:
        ap = argparse.ArgumentParser(prog=prog, description="The pytest plugin's own tools: 'sensitivity' runs a "
                                     "lane once clean and once per registered defect and fails if one goes "
                                     "uncaught; 'dashboard' renders the results store as one HTML file.")
        sub = ap.add_subparsers(dest="command", required=True)
        for name, text in commands.items():
            sub.add_parser(name, help=text, add_help=False)
        ap.parse_args(argv)  # prints help or the usage error and exits
        return 2
    command, rest = argv[0], argv[1:]
    if command == "dashboard":
        return dashboard_command(rest, f"{prog} dashboard")
    return sensitivity_command(rest, f"{prog} sensitivity")


def sensitivity_command(argv: list[str], prog: str) -> int:
    """``kvcm sensitivity`` / ``pytest-kvcm sensitivity``."""
    from .sensitivity import main as sensitivity_main

    return sensitivity_main(_sensitivity_parser(prog).parse_args(argv))


def dashboard_command(argv: list[str], prog: str) -> int:
    """``kvcm dashboard`` / ``pytest-kvcm dashboard``."""
    from .dashboard import main as dashboard_main

    return dashboard_main(argv, prog=prog)


if __name__ == "__main__":
    sys.exit(main())
