"""Lane stages (``--kvcm-stage-split=K/N``): every test of a lane in exactly one of N stages, the stages'
recorded durations within 20% of each other, the same cut on every run."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from _lane_project import order_of, project, run  # noqa: F401  (project is a fixture)

from pytest_kvcm.lanes.stages import assign_stages, parse_split

LANE = """
    l0_cpu:
    - tests:
      - suites/a
      - suites/b
"""
ALL = ["suites/a/test_a.py::test_one", "suites/a/test_a.py::test_two", "suites/a/test_a.py::test_p[1]",
       "suites/a/test_a.py::test_p[2]", "suites/b/test_b.py::test_three", "suites/b/test_b.py::test_four"]


def _heavy_tailed(n: int, seed: int) -> dict[str, float]:
    """Durations shaped like a real lane's: most tests under a second, a few taking a minute."""
    rng = random.Random(seed)
    return {f"suites/x/test_{i // 10}.py::test_{i}": round(rng.lognormvariate(0.0, 1.5), 3) for i in range(n)}


@pytest.mark.parametrize("stages", [1, 2, 3, 4, 6])
def test_every_test_is_in_exactly_one_stage_and_durations_balance(stages):
    durations = _heavy_tailed(300, seed=stages)
    ids = sorted(durations)
    cut = assign_stages(ids, durations, stages)
    flat = [i for stage in cut for i in stage]
    assert sorted(flat) == ids and len(flat) == len(set(flat))
    totals = [sum(durations[i] for i in stage) for stage in cut]
    mean = sum(totals) / stages
    assert max(totals) <= 1.2 * mean and min(totals) >= 0.8 * mean, totals


def test_the_shipped_cpu_lane_durations_balance_within_20_percent():
    """ci/durations/l0_cpu.json, recorded from a whole l0_cpu run (--kvcm-version=both --kvcm-record-durations)."""
    path = Path(__file__).resolve().parents[2] / "ci" / "durations" / "l0_cpu.json"
    durations = json.loads(path.read_text())
    ids = sorted(durations)
    assert len(ids) > 100
    for stages in (2, 3, 4, 6):
        cut = assign_stages(ids, durations, stages)
        assert sorted(i for stage in cut for i in stage) == ids
        totals = [sum(durations[i] for i in stage) for stage in cut]
        mean = sum(totals) / stages
        assert max(totals) <= 1.2 * mean and min(totals) >= 0.8 * mean, (stages, totals)


def test_the_cut_does_not_depend_on_collection_order():
    durations = _heavy_tailed(120, seed=7)
    ids = sorted(durations)
    shuffled = ids[:]
    random.Random(1).shuffle(shuffled)
    assert [sorted(s) for s in assign_stages(ids, durations, 4)] == \
        [sorted(s) for s in assign_stages(shuffled, durations, 4)]


def test_unrecorded_tests_weigh_the_median():
    cut = assign_stages(["a", "b", "c", "new"], {"a": 10.0, "b": 1.0, "c": 1.0}, 2)
    assert cut == [["a"], ["b", "c", "new"]]


@pytest.mark.parametrize("text", ["0/3", "4/3", "1", "a/b", "1/0"])
def test_bad_split_names_the_value(text):
    with pytest.raises(pytest.UsageError, match=f"--kvcm-stage-split='{text}'"):
        parse_split(text)


def test_stages_of_a_real_run_cover_the_lane_once(pytester, project):
    project("l0_cpu", LANE)
    (pytester.path / "ci/durations").mkdir()
    durations = {**{i: 1.0 for i in ALL}, "suites/b/test_b.py::test_four": 50.0}
    (pytester.path / "ci/durations/l0_cpu.json").write_text(json.dumps(durations))
    runs = []
    for k in (1, 2, 3):
        result = run(pytester, "--kvcm-lane=l0_cpu", f"--kvcm-stage-split={k}/3", "-v")
        runs.append(order_of(result))
        result.stdout.fnmatch_lines([f"*stage {k}/3: {len(runs[-1])} of 6 tests*"])
    assert runs[0] == ["suites/b/test_b.py::test_four"]  # the recorded 50 s test has a stage of its own
    flat = [i for r in runs for i in r]
    assert sorted(flat) == sorted(ALL) and len(flat) == len(set(flat))


def test_record_durations_writes_the_lane_file(pytester, project):
    project("l0_cpu", LANE)
    run(pytester, "--kvcm-lane=l0_cpu", "--kvcm-record-durations").assert_outcomes(passed=6)
    recorded = json.loads((pytester.path / "ci/durations/l0_cpu.json").read_text())
    assert sorted(recorded) == sorted(ALL) and all(v >= 0 for v in recorded.values())


def test_split_without_a_lane_is_a_usage_error(pytester, project):
    result = run(pytester, "--kvcm-stage-split=1/2")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "--kvcm-stage-split=1/2: splits a lane; give --kvcm-lane too" in result.stderr.str()
