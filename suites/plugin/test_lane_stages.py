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


@pytest.mark.parametrize("lane", ["l0_h100", "l0_h200"])
def test_the_gpu_lane_stages_balance_and_give_each_stage_its_share_of_gpu_tests(lane):
    """ci/gpu_lane.sh runs the GPU lane in 3 stages, one device call (600 s) each: the heavy GPU and slow tests
    (20 s each in the shipped file until a GPU run's recordings replace them) must not gather in one stage."""
    path = Path(__file__).resolve().parents[2] / "ci" / "durations" / f"{lane}.json"
    durations = json.loads(path.read_text())
    ids = sorted(durations)
    cut = assign_stages(ids, durations, 3)
    totals = [sum(durations[i] for i in stage) for stage in cut]
    assert max(totals) <= 1.2 * min(totals), totals
    heavy = [sum(1 for i in stage if durations[i] >= 20.0) for stage in cut]
    assert max(heavy) - min(heavy) <= max(2, sum(heavy) // 6), heavy


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


def test_a_stage_records_into_its_own_file_and_leaves_the_cut_as_it_was(pytester, project):
    """ci/gpu_lane.sh: stage 1 of 2 writes its times to --kvcm-durations-out; stage 2 still reads the old file."""
    project("l0_cpu", LANE)
    (pytester.path / "ci/durations").mkdir()
    lane_file = pytester.path / "ci/durations/l0_cpu.json"
    lane_file.write_text(json.dumps({i: 1.0 for i in ALL}))
    before = lane_file.read_text()
    result = run(pytester, "--kvcm-lane=l0_cpu", "--kvcm-stage-split=1/2", "--kvcm-record-durations",
                 "--kvcm-durations-out=out/stage1.json", "-v")
    result.assert_outcomes(passed=3)
    assert lane_file.read_text() == before
    recorded = json.loads((pytester.path / "out/stage1.json").read_text())
    assert sorted(recorded) == sorted(order_of(result))


def test_durations_out_without_recording_is_a_usage_error(pytester, project):
    project("l0_cpu", LANE)
    result = run(pytester, "--kvcm-lane=l0_cpu", "--kvcm-durations-out=x.json")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "--kvcm-durations-out=x.json: names where --kvcm-record-durations writes" in result.stderr.str()


def test_split_without_a_lane_is_a_usage_error(pytester, project):
    result = run(pytester, "--kvcm-stage-split=1/2")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "--kvcm-stage-split=1/2: splits a lane; give --kvcm-lane too" in result.stderr.str()
