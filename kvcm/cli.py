"""The ``kvcm`` command: ``plan`` (size a cache on paper), ``sensitivity`` (prove the suites catch every
historic defect) and ``dashboard`` (render the accuracy dashboard from the results store)."""

from __future__ import annotations

import argparse
import sys


def main(argv=None) -> int:
    from . import plan

    parser = argparse.ArgumentParser(prog="kvcm", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    plan.add_arguments(sub.add_parser("plan", help="size a model's KV cache: pools, constraints, warmup plan"))
    sens = sub.add_parser("sensitivity", help="run the CPU lane once per registered defect; fail if one is missed")
    sens.add_argument("--lane", default="l0_cpu")
    sens.add_argument("--defect", action="append", default=None, help="only these defects (repeatable)")
    sens.add_argument("--pytest-args", default="", help="extra arguments for every pytest run")
    sens.add_argument("--json", default=None, help="also write the table as JSON to this file")
    sub.add_parser("dashboard", help="render the accuracy dashboard (see `kvcm dashboard --help`)", add_help=False)
    args, rest = parser.parse_known_args(argv)
    if args.command == "dashboard":
        from pytest_kvcm.dashboard import main as dashboard_main

        return dashboard_main(rest)
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    if args.command == "plan":
        return plan.main(args)
    from pytest_kvcm.sensitivity import main as sensitivity_main

    return sensitivity_main(args)


if __name__ == "__main__":
    sys.exit(main())
