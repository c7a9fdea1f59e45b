"""The ``kvcm`` command: ``plan`` (size a cache on paper), and the commands other installed packages register.

A package adds ``kvcm NAME`` through the ``kvcm.commands`` entry-point group (``NAME = "module:function"``,
called as ``function(argv, prog)`` and returning the exit status): the pytest plugin adds ``sensitivity`` and
``dashboard`` that way. The library looks the group up and imports nothing of any such package itself.
"""

from __future__ import annotations

import argparse
import os
import sys

COMMAND_GROUP = "kvcm.commands"
# pytest-kvcm is not on PyPI: it is installed from a checkout of its repository or from a wheel built there
INSTALL = ("pytest-kvcm is not on PyPI: pip install -e '.[test]' in a checkout of its repository, or "
           "pip install 'pytest_kvcm-<version>-py3-none-any.whl[test]' built there (pip wheel --no-deps -w dist .); "
           "from a source tree without installing, python -m pytest_kvcm.cli COMMAND")
DESCRIPTION = ("Reference KV cache managers. 'kvcm plan' sizes a model's KV cache on paper; installed packages add "
               "commands of their own (pytest-kvcm's plugin adds 'kvcm sensitivity' and 'kvcm dashboard'). "
               "'kvcm COMMAND --help' for each.")


def registered_commands() -> dict:
    """``name -> entry point`` of every command an installed package registers in ``kvcm.commands``."""
    from importlib.metadata import entry_points

    return {ep.name: ep for ep in entry_points(group=COMMAND_GROUP) if ep.name != "plan"}


def _registered_command(entry, argv: list[str]) -> int:
    prog = f"kvcm {argv[0]}"
    try:
        command = entry.load()
    except ImportError as exc:
        print(f"{prog}: this command comes with an installed package that is not importable ({exc}); "
              f"reinstall it ({INSTALL})", file=sys.stderr)
        return 2
    return command(argv[1:], prog)


class OneLineParser(argparse.ArgumentParser):
    """argparse with this CLI's convention for bad input: one line on stderr, exit status 2 (argparse prints
    its usage block first, a dozen lines for ``kvcm plan``; ``--help`` still shows it)."""

    def error(self, message):
        self.exit(2, f"{self.prog}: {message} (see {self.prog} --help)\n")


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    commands = registered_commands()
    if argv and argv[0] in commands:
        return _registered_command(commands[argv[0]], argv)
    if argv and not argv[0].startswith("-") and argv[0] != "plan":
        known = ", ".join(["plan", *sorted(commands)])
        print(f"kvcm: no command {argv[0]!r} (installed: {known}); 'kvcm sensitivity' and 'kvcm dashboard' come "
              f"with pytest-kvcm's plugin, registered when the package is installed ({INSTALL})", file=sys.stderr)
        return 2
    debug = "--debug" in argv
    argv = [a for a in argv if a != "--debug"]
    from . import plan

    # allow_abbrev=False: a prefix is not an option (``--tp 8`` once planned ``--tpb 8`` without a word)
    parser = OneLineParser(prog="kvcm", description=DESCRIPTION, allow_abbrev=False)
    parser.add_argument("--debug", action="store_true", help="on an error, show the Python traceback too (default: off)")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=OneLineParser)
    plan.add_arguments(sub.add_parser("plan", help="size a model's KV cache: pools, constraints, warmup plan",
                                      allow_abbrev=False))
    for name, entry in sorted(commands.items()):
        owner = entry.dist.name if entry.dist is not None else entry.value
        sub.add_parser(name, help=f"from {owner} (see `kvcm {name} --help`)", add_help=False)
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        print(f"kvcm {args.command}: unrecognized arguments: {' '.join(unknown)} (see kvcm {args.command} --help)",
              file=sys.stderr)
        return 2
    try:
        return plan.main(args)
    except BrokenPipeError:  # `kvcm plan | head`: the reader has what it wanted; no message, as cat and grep
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # so the exit flush does not fail again
        return 0
    except Exception as exc:  # one line for the user; --debug keeps the traceback
        if debug:
            raise
        return _report(args.command, exc)
    except SystemExit as exc:
        if not isinstance(exc.code, str):
            raise
        print(exc.code, file=sys.stderr)
        return 2


BAD_INPUT = (ValueError, KeyError, TypeError, OSError, ArithmeticError)  # ConfigError is a ValueError


def _report(command: str, exc: Exception) -> int:
    """Exit 2 with one line for bad input (argparse's convention); 1 with a pointer to --debug for anything else."""
    from .errors import KvcmError

    if isinstance(exc, (KvcmError, *BAD_INPUT)):
        kind = "" if isinstance(exc, KvcmError) else f"{type(exc).__name__}: "
        print(f"kvcm {command}: {kind}{exc}", file=sys.stderr)
        return 2
    print(f"kvcm {command}: internal error {type(exc).__name__}: {exc} (run again with --debug for the traceback)",
          file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
