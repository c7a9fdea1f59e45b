"""``python -m pytest_kvcm.contract --keys``: the declared-difference keys, what each declares and what the suites
do about it, from the installed package (the wheel ships no docs; docs/contract.md's table is this output).

``python -m pytest_kvcm.contract`` alone says how to run the suites on a manager.
"""

from __future__ import annotations

import argparse
import os
import sys

from pytest_kvcm.targets.differences import KEYS, NOTES

USAGE = ("run the contract suites on your manager: pytest --kvcm-target=NAME --pyargs pytest_kvcm.contract, with "
         "your adapter registered in a conftest.py (pytest_kvcm_register_targets; the adapter's members: "
         "help(pytest_kvcm.targets.KVCacheTarget)); --keys lists what an adapter's differences may declare")


def keys_table() -> str:
    """The keys as a Markdown table, then the notes that relax nothing."""
    rows = ["| key | the design it declares | what the suites do about it |", "| --- | --- | --- |"]
    rows += [f"| `{key}` | {design} | {relaxes} |" for key, (design, relaxes) in KEYS.items()]
    notes = ", ".join(f"`{key}` ({text})" for key, text in NOTES.items())
    return "\n".join(rows) + f"\n\nNotes for the reader, which no test reads and which relax nothing: {notes}.\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pytest_kvcm.contract", description=USAGE)
    ap.add_argument("--keys", action="store_true", help="print the keys of an adapter's differences and what each "
                                                        "relaxes (default: print how to run the suites)")
    args = ap.parse_args(argv)
    try:
        print(keys_table() if args.keys else USAGE)
    except BrokenPipeError:  # `... --keys | head`: the reader has what it wanted
        sys.stdout = open(os.devnull, "w")
    return 0


if __name__ == "__main__":
    sys.exit(main())
