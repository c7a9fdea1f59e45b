"""The ``pytest-kvcm`` command: the plugin's own tools, kept out of the ``kvcm`` library.

* ``sensitivity``: run a lane once clean and once per registered defect; fail if one goes uncaught.
* ``dashboard``: render the results store as one HTML file.

The plugin registers both as ``kvcm`` commands too (the ``kvcm.commands`` entry-point group of pyproject.toml:
:func:`sensitivity_command`, :func:`dashboard_command`), so the library finds them without importing the plugin.
"""

from __future__ import annotations

import argparse
import sys


class OneLineParser(argparse.ArgumentParser):
    """Bad input is one line on stderr and exit status 2, as in ``kvcm plan``; a prefix is not an option
    (``--res`` is not ``--results``); ``--help`` still prints the usage."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message):
        self.exit(2, f"{self.prog}: {message} (see {self.prog} --help)\n")


def _sensitivity_parser(prog: str) -> argparse.ArgumentParser:
    ap = OneLineParser(prog=prog, description="Run a lane once per registered defect; fail if one is missed.")
    ap.add_argument("--lane", default=None, help="the lane (ci/LANE.yml) to run; checked before any run (default: "
                    "l0_cpu, needed only by full mode and defects that name no catchers)")
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
                    help="tests that must fail for a defect to count as caught, >= 1 (default: 2)")
    ap.add_argument("--jobs", type=int, default=None,
                    help="pytest runs at once, >= 1 (default: $KVCM_SENSITIVITY_JOBS, else 1)")
    return ap


def main(argv: list[str] | None = None, prog: str = "pytest-kvcm") -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    commands = {"sensitivity": "run the lane once per registered defect; fail if one is missed",
                "dashboard": "render the accuracy dashboard from the results store"}
    if not argv or argv[0] not in commands:
        ap = OneLineParser(prog=prog, description="The pytest plugin's own tools: 'sensitivity' runs a "
                                     "lane once clean and once per registered defect and fails if one goes "
                                     "uncaught; 'dashboard' renders the results store as one HTML file.")
        sub = ap.add_subparsers(dest="command", required=True, parser_class=OneLineParser)
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

    return sensitivity_main(_sensitivity_parser(prog).parse_args(_joined(argv, "--pytest-args")))


def _joined(argv: list[str], option: str) -> list[str]:
    """``OPTION VALUE`` as ``OPTION=VALUE``: argparse reads a value that starts with '-' (``--pytest-args -x``,
    ``--pytest-args "-m 'not slow'"``) as an option and fails with "expected one argument"."""
    out, i = [], 0
    while i < len(argv):
        if argv[i] == option and i + 1 < len(argv):
            out.append(f"{option}={argv[i + 1]}")
            i += 2
        else:
            out.append(argv[i])
            i += 1
    return out


def dashboard_command(argv: list[str], prog: str) -> int:
    """``kvcm dashboard`` / ``pytest-kvcm dashboard``."""
    from .dashboard import main as dashboard_main

    return dashboard_main(argv, prog=prog)


if __name__ == "__main__":
    sys.exit(main())
