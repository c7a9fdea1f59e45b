"""Lane stages: ``--kvcm-stage-split=K/N`` runs stage K of N of a lane, the stages balanced by recorded durations.

TensorRT-LLM's CI cuts a long lane into numbered stages that run on separate machines; this is that cut. The
durations come from ``ci/durations/<lane>.json`` (``{"node id": seconds}``; ``--kvcm-durations`` names another
file) and are written by a run with ``--kvcm-record-durations`` (setup + call + teardown of every test that ran,
merged into the file, or into ``--kvcm-durations-out PATH``: the stages of one lane run on separate machines
then each write their own file and read the same cut, ``ci/gpu_lane.sh``). A test with no recording weighs the median of the recorded ones (1 s when none are).

The cut is longest-processing-time first: tests sorted by (duration descending, node id), each given to the
stage with the least total so far (ties: the lowest stage). It depends only on the lane's selected ids and the
file, never on collection order, the machine or the xdist worker: the same lane and durations put a test in the
same stage on every machine, and every test of the lane in exactly one stage.

Its cost is O(T log min(N, T)) for T tests, whatever N: only the first ``min(N, T)`` stages can receive a test
(a lower empty stage always wins a tie), so ``--kvcm-stage-split=1/100000`` answers as fast as ``1/1`` (it
used to take a minute: every test scanned all N totals).
"""

from __future__ import annotations

import heapq
import json
import statistics
from pathlib import Path

import pytest

from ..paths import output_problem, write_atomically

_SPLIT = pytest.StashKey[tuple]()  # (K, N)
_RECORD = pytest.StashKey[dict]()  # node id -> seconds, while recording
_PATH = pytest.StashKey[Path]()
_OUT = pytest.StashKey[Path]()  # where recorded durations go when not the durations file



def parse_split(text: str) -> tuple[int, int]:
    """``"2/5"`` -> ``(2, 5)``; a usage error naming the value otherwise."""
    k, sep, n = text.partition("/")
    try:
        stage, stages = int(k), int(n)
    except ValueError:
        stage = stages = 0
    if not sep or stages < 1 or not 1 <= stage <= stages:
        raise pytest.UsageError(f"--kvcm-stage-split={text!r}: expected K/N with 1 <= K <= N, e.g. 2/4")
    return stage, stages


def load_durations(path: Path) -> dict[str, float]:
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise pytest.UsageError(f"durations file {path}: not JSON: {exc}") from None
    if not isinstance(data, dict) or not all(isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0
                                             for v in data.values()):
        raise pytest.UsageError(f"durations file {path}: expected an object of node id -> seconds >= 0")
    return {str(k): float(v) for k, v in data.items()}


def stage_of(ids: list[str], durations: dict[str, float], stages: int) -> dict[str, int]:
    """Each id's stage (0-based): longest first, to the stage with the least total (ties: the lowest)."""
    known = [durations[i] for i in ids if i in durations]
    default = statistics.median(known) if known else 1.0
    weight = {i: durations.get(i, default) for i in ids}
    heap = [(0.0, s) for s in range(min(stages, len(weight)))]  # already a heap: equal totals, rising stages
    out: dict[str, int] = {}
    for i in sorted(weight, key=lambda i: (-weight[i], i)):
        total, s = heapq.heappop(heap)
        out[i] = s
        heapq.heappush(heap, (total + weight[i], s))
    return out


def stage_ids(ids: list[str], durations: dict[str, float], stages: int, stage: int) -> list[str]:
    """The ids of 1-based ``stage`` of ``stages``, in the order of ``ids``."""
    where = stage_of(ids, durations, stages)
    return [i for i in ids if where[i] == stage - 1]


def assign_stages(ids: list[str], durations: dict[str, float], stages: int) -> list[list[str]]:
    """The ``stages`` stages of ``ids`` (each a list in the order of ``ids``), balanced by ``durations``."""
    where = stage_of(ids, durations, stages)
    cut: list[list[str]] = [[] for _ in range(stages)]
    for i in ids:
        cut[where[i]].append(i)
    return cut


def durations_path(config: pytest.Config, lane_name: str) -> Path:
    given = config.getoption("kvcm_durations")
    if given:
        path = Path(given)
        return path if path.is_absolute() else config.invocation_params.dir / path
    return config.rootpath / "ci" / "durations" / f"{lane_name}.json"


def configure(config: pytest.Config, lane_name: str | None) -> None:
    """Called by lane selection once the lane is known: check the options, start recording if asked."""
    split = config.getoption("kvcm_stage_split")
    record = config.getoption("kvcm_record_durations")
    if split and lane_name is None:
        raise pytest.UsageError(f"--kvcm-stage-split={split}: splits a lane; give --kvcm-lane too")
    if record and lane_name is None and not config.getoption("kvcm_durations"):
        raise pytest.UsageError("--kvcm-record-durations: give --kvcm-lane (the file is ci/durations/<lane>.json) "
                                "or --kvcm-durations PATH")
    out = config.getoption("kvcm_durations_out")
    if out is not None and not record:
        raise pytest.UsageError(f"--kvcm-durations-out={out}: names where --kvcm-record-durations writes; give it too")
    if out is not None:
        out_path = Path(out) if Path(out).is_absolute() else config.invocation_params.dir / out
        if not out or out_path.is_dir():
            raise pytest.UsageError(f"--kvcm-durations-out={out!r}: expected a file path, not a directory")
        config.stash[_OUT] = out_path
    if not (split or record):
        return
    config.stash[_PATH] = path = durations_path(config, lane_name or "")
    _check_durations_file(path, split=split, record=record, named=bool(config.getoption("kvcm_durations")))
    if split:
        config.stash[_SPLIT] = parse_split(split)
    if record and not hasattr(config, "workerinput"):  # the xdist controller sees every report
        config.stash[_RECORD] = {}


def _check_durations_file(path: Path, *, split, record, named: bool) -> None:
    """At start-up, not at the end of a run: a directory, a FIFO or a file that is not a durations object is
    refused; a missing file is refused when ``--kvcm-durations`` named it for a split (its stages would be
    silently unbalanced) and, when recording, when its directory does not exist. Recording replaces only a
    durations file."""
    if path.exists() or path.is_symlink():
        if not path.is_file():
            raise pytest.UsageError(f"durations file {path}: is not a regular file (a directory?); give a JSON file")
        load_durations(path)  # a usage error naming the file when it is not node id -> seconds
    elif split and named and not record:
        raise pytest.UsageError(f"durations file {path}: no such file (record one with --kvcm-record-durations)")
    elif record and named:  # the default ci/durations/ is made on first use
        problem = output_problem(path)
        if problem:
            raise pytest.UsageError(f"durations file {path}: {problem}")


def select_stage(config: pytest.Config, items: list[pytest.Item]) -> str | None:
    """Keep the items of this run's stage (the rest deselected); a summary phrase, or None without a split."""
    split = config.stash.get(_SPLIT, None)
    if split is None:
        return None
    stage, stages = split
    path = config.stash[_PATH]
    durations = load_durations(path)
    ids = [i.nodeid for i in items]
    mine = set(stage_ids(ids, durations, stages, stage))
    dropped = [i for i in items if i.nodeid not in mine]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
    items[:] = [i for i in items if i.nodeid in mine]
    recorded = sum(1 for i in ids if i in durations)
    mine_s = sum(durations.get(i, 0.0) for i in mine)
    return (f"stage {stage}/{stages}: {len(items)} of {len(ids)} tests, {mine_s:.1f} s of "
            f"{sum(durations.get(i, 0.0) for i in ids):.1f} s recorded ({len(ids) - recorded} without a recording)")


@pytest.hookimpl(trylast=True)
def pytest_sessionstart(session: pytest.Session) -> None:
    if _RECORD in session.config.stash:
        session.config.pluginmanager.register(_Recorder(session.config), "kvcm-durations-recorder")


class _Recorder:
    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.seconds = config.stash[_RECORD]

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.seconds[report.nodeid] = self.seconds.get(report.nodeid, 0.0) + report.duration

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if not self.seconds:
            return
        path = self.config.stash.get(_OUT, None) or self.config.stash[_PATH]
        merged = {**load_durations(path), **{k: round(v, 3) for k, v in self.seconds.items()}}
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(path, json.dumps(dict(sorted(merged.items())), indent=1) + "\n")  # never half a file
