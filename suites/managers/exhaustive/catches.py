"""Which catalogued defects the explorer catches at the pre-merge scale and at the full one (issue 50.2).

    python -m suites.managers.exhaustive.catches [--quick 0.1] [--defect NAME ...] [--json FILE]

Each defect's default configurations are searched at the quick scale (``budget`` with ``QUICK_FLOORS``), each
stopping at its first violation; the defects the quick form misses are searched again at scale 1 (the full
default explorer, post-merge). A breadth-first search with a larger budget visits every state a smaller one
visits, so what the quick form catches the full one catches too; the list that matters is the full form's
catches the quick one misses, and this exits 1 when it is not empty. A configuration that cannot be searched
under a defect (broken) is listed apart: it is an error in the test run, never a catch."""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1]))   # the search imports suites/managers/_observe.py as pytest does

from .configs import default_configs  # noqa: E402
from .conftest import SECONDS_A_STATE, _injected, budget  # noqa: E402
from .search import search  # noqa: E402


def _job(job):
    index, scale, defect = job
    cfg = default_configs()[index]
    states = budget(cfg, scale)
    with _injected(defect):
        report = search(cfg, states, seconds=60 + SECONDS_A_STATE * states, first_violation=True)
    if report.broken:
        return defect, cfg.name, "broken", report.broken
    if report.violations:
        v = report.violations[0]
        return defect, cfg.name, "caught", f"{v.kind}: {v.message}"[:200]
    return defect, cfg.name, "clean", ""


def sweep(defects: list[str], scale: float, jobs: int) -> dict[str, dict]:
    """Each defect's outcome at ``scale``: the configurations that caught it and those broken under it."""
    todo = [(i, scale, d) for d in defects for i in range(len(default_configs()))]
    out = {d: {"caught": {}, "broken": {}} for d in defects}
    with multiprocessing.get_context("fork").Pool(jobs) as pool:
        for defect, name, outcome, detail in pool.imap_unordered(_job, todo, chunksize=1):
            if outcome != "clean":
                out[defect][outcome][name] = detail
    return out


def main(argv: list[str] | None = None) -> int:
    from pytest_kvcm.defects import builtin_defects

    parser = argparse.ArgumentParser(prog="python -m suites.managers.exhaustive.catches", description=__doc__.split("\n")[0])
    parser.add_argument("--quick", type=float, default=0.1, help="the pre-merge scale (default 0.1)")
    parser.add_argument("--defect", action="append", help="only these defects (default: every built-in one)")
    parser.add_argument("--json", help="also write the table to this file")
    args = parser.parse_args(argv)
    names = [d.name for d in builtin_defects() if d.replaces]
    unknown = sorted(set(args.defect or ()) - set(names))
    if unknown:
        parser.error(f"--defect {unknown[0]!r}: not a built-in defect with a policy replacement")
    chosen = args.defect or names
    jobs = os.cpu_count() or 1
    t0 = time.perf_counter()
    quick = sweep(chosen, args.quick, jobs)
    t_quick = time.perf_counter() - t0
    missed = [d for d in chosen if not quick[d]["caught"]]
    full = sweep(missed, 1.0, jobs) if missed else {}
    t_full = time.perf_counter() - t0 - t_quick
    only_full = [d for d in missed if full[d]["caught"]]
    table = {"quick_scale": args.quick, "defects": len(chosen), "quick_seconds": round(t_quick, 1),
             "full_seconds_for_missed": round(t_full, 1),
             "caught_quick": sorted(d for d in chosen if quick[d]["caught"]), "caught_only_full": only_full,
             "missed_by_both": sorted(d for d in missed if not full[d]["caught"]),
             "broken": {d: sorted({**quick[d]["broken"], **full.get(d, {}).get("broken", {})}) for d in chosen
                        if quick[d]["broken"] or full.get(d, {}).get("broken")},
             "first_catch": {d: next(iter(sorted(quick[d]["caught"].items()))) for d in chosen if quick[d]["caught"]}}
    print(f"explorer at scale {args.quick}: {len(table['caught_quick'])} of {len(chosen)} defects caught "
          f"({t_quick:.0f} s); at scale 1 the {len(missed)} missed: {len(only_full)} caught ({t_full:.0f} s)")
    for d in only_full:
        print(f"  caught only at scale 1: {d} ({sorted(full[d]['caught'])})")
    for d, cfgs in table["broken"].items():
        print(f"  broken under {d}: {len(cfgs)} configuration(s), e.g. {cfgs[0]}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(table, fh, indent=1)
    return 1 if only_full else 0


if __name__ == "__main__":
    sys.exit(main())
