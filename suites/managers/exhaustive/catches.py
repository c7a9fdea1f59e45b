"""Which catalogued defects the explorer catches at the pre-merge scale and at the full one (issue 50.2).

    python -m suites.managers.exhaustive.catches [--quick 0.1] [--defect NAME ...] [--json FILE]

Searching 82 defects x 100 configurations at the full budget is hours on two cores, and nearly all of it would
repeat the clean search: a defect replaces a few decisions, and a configuration whose search never asks them, or
asks a rule only with arguments where the replacement answers as the default does, walks exactly the clean
search's states (every call before the first differing answer is the same call), which has no violation. So one
clean search at the full budget records what each configuration asks (``Recorder``: each decision read, each
rule's arguments), and a defect is searched only where it can change an answer (a setting read, a rule asked
with arguments where the two differ, or a rule whose arguments cannot be kept: a pool, a tensor). Those
configurations are searched at the quick scale (``budget`` with ``QUICK_FLOORS``, as pre-merge), and where the
quick form finds nothing, at scale 1, each stopping at its first violation. A breadth-first search with a larger
budget visits every state a smaller one visits, so what the quick form catches the full one catches too; this
exits 1 when the full form catches a defect the quick one misses. A configuration a defect leaves unsearchable is
listed apart (broken). The user-rule configurations are left out: every rule there is the user's (a defect's
replacement too), so they are not the catalogue's managers.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1]))   # the search imports suites/managers/_observe.py as pytest does

import kvcm.policy  # noqa: E402
from kvcm.policy import DECISIONS, Policy  # noqa: E402

from .configs import default_configs  # noqa: E402
from .conftest import budget, searched  # noqa: E402
from .search import search  # noqa: E402

KEEP_ARGS = 20_000        # distinct argument tuples kept a rule; past it, the rule counts as asked with anything


def _configs():
    return [c for c in default_configs() if not c.user_rules]


def _plain(value) -> bool:
    """A value that is only data (numbers, strings, None, tuples of them): a rule asked with it cannot change it."""
    if isinstance(value, tuple):
        return all(_plain(v) for v in value)
    return value is None or isinstance(value, (int, float, str, bool))


class Recorder(Policy):
    """The default policy, noting every decision read and every rule's arguments (``asked``)."""

    asked: dict = {}

    def __getattribute__(self, name):
        value = object.__getattribute__(self, name)
        decision = DECISIONS.get(name) if not name.startswith("_") else None
        if decision is None:
            return value
        Recorder.asked.setdefault(name, set())
        if decision.kind != "rule":
            return value

        def rule(*args, **kwargs):
            kept = Recorder.asked[name]
            if kept is not None:
                asked = (args, tuple(sorted(kwargs.items())))
                if len(kept) >= KEEP_ARGS or not _plain(asked):   # a pool, a tensor: asked with anything
                    Recorder.asked[name] = None
                else:
                    kept.add(asked)
            return value(*args, **kwargs)

        return rule


def _record(index: int):
    cfg = _configs()[index]
    Recorder.asked = {}
    with kvcm.policy.applied(object.__new__(Recorder)):
        report = search(cfg, budget(cfg, 1.0), seconds=None)
    return index, Recorder.asked, report.line()


def _differs(defect, asked: dict) -> bool:
    """Whether ``defect`` can change an answer of a search that asked ``asked``."""
    for name, replacement in defect.replaces.items():
        if name not in asked:
            continue
        if DECISIONS[name].kind != "rule" or asked[name] is None:
            return True
        default = getattr(kvcm.policy.DEFAULT, name)
        for args, kwargs in asked[name]:
            try:
                if replacement(*args, **dict(kwargs)) != default(*args, **dict(kwargs)):
                    return True
            except Exception:  # noqa: BLE001 - a replacement that raises where the default answers differs
                return True
    return False


def _job(job):
    index, scale, defect = job
    cfg = _configs()[index]
    report = searched(cfg, scale, defect, first_violation=True)
    if report.broken:
        return defect, cfg.name, "broken", report.broken
    if report.violations:
        v = report.violations[0]
        return defect, cfg.name, "caught", f"{v.kind}: {v.message}"[:200]
    return defect, cfg.name, "clean", ""


def sweep(pool, todo: list[tuple[int, float, str]]) -> dict[str, dict]:
    """Each defect's outcome over its jobs: the configurations that caught it and those broken under it."""
    out: dict[str, dict] = {}
    for defect, name, outcome, detail in pool.imap_unordered(_job, todo, chunksize=1):
        entry = out.setdefault(defect, {"caught": {}, "broken": {}})
        if outcome != "clean":
            entry[outcome][name] = detail
    return out


def main(argv: list[str] | None = None) -> int:
    from pytest_kvcm.defects import builtin_defects

    parser = argparse.ArgumentParser(prog="python -m suites.managers.exhaustive.catches",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--quick", type=float, default=0.1, help="the pre-merge scale (default 0.1)")
    parser.add_argument("--defect", action="append", help="only these defects (default: every built-in one)")
    parser.add_argument("--json", help="also write the table to this file")
    args = parser.parse_args(argv)
    defects = {d.name: d for d in builtin_defects() if d.replaces}
    unknown = sorted(set(args.defect or ()) - set(defects))
    if unknown:
        parser.error(f"--defect {unknown[0]!r}: not a built-in defect with a policy replacement")
    chosen = args.defect or list(defects)
    cfgs = _configs()
    t0 = time.perf_counter()
    with multiprocessing.get_context("fork").Pool(os.cpu_count() or 1) as pool:
        asked = {i: a for i, a, _ in pool.imap_unordered(_record, range(len(cfgs)), chunksize=1)}
        t_record = time.perf_counter() - t0
        affected = {d: [i for i in range(len(cfgs)) if _differs(defects[d], asked[i])] for d in chosen}
        quick = sweep(pool, [(i, args.quick, d) for d in chosen for i in affected[d]])
        t_quick = time.perf_counter() - t0 - t_record
        missed = [d for d in chosen if not quick.get(d, {}).get("caught")]
        full = sweep(pool, [(i, 1.0, d) for d in missed for i in affected[d]])
        t_full = time.perf_counter() - t0 - t_record - t_quick
    caught_quick = sorted(d for d in chosen if quick.get(d, {}).get("caught"))
    only_full = sorted(d for d in missed if full.get(d, {}).get("caught"))
    broken = {d: sorted({**quick.get(d, {}).get("broken", {}), **full.get(d, {}).get("broken", {})})
              for d in chosen}
    table = {"quick_scale": args.quick, "configurations": len(cfgs), "defects": len(chosen),
             "seconds": {"record": round(t_record, 1), "quick": round(t_quick, 1), "full": round(t_full, 1)},
             "searched": {d: len(affected[d]) for d in chosen},
             "caught_quick": caught_quick, "caught_only_full": only_full,
             "missed_by_both": sorted(d for d in missed if d not in only_full),
             "broken": {d: b for d, b in broken.items() if b},
             "first_catch": {d: sorted(quick[d]["caught"].items())[0] for d in caught_quick}}
    print(f"explorer, {len(cfgs)} configurations, {len(chosen)} defects: recorded the clean search in "
          f"{t_record:.0f} s; at scale {args.quick} {len(caught_quick)} caught ({t_quick:.0f} s); at scale 1 the "
          f"{len(missed)} missed: {len(only_full)} caught ({t_full:.0f} s)")
    for d in only_full:
        print(f"  caught only at scale 1: {d} ({sorted(full[d]['caught'])})")
    for d, cfg_names in table["broken"].items():
        print(f"  broken under {d}: {len(cfg_names)} configuration(s), e.g. {cfg_names[0]}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(table, fh, indent=1)
    return 1 if only_full else 0


if __name__ == "__main__":
    sys.exit(main())
