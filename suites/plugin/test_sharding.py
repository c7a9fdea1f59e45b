"""Sharding: which CUDA_VISIBLE_DEVICES each xdist worker gets, set before CUDA can start."""

from __future__ import annotations

import textwrap

import pytest

from pytest_kvcm.sharding import plan, visible_devices, worker_devices, worker_index


def test_worker_index():
    assert [worker_index(w) for w in ("gw0", "gw12", "master", "", None, "gwx")] == [0, 12, None, None, None, None]


@pytest.mark.parametrize("index, g, visible, expected", [
    (0, 1, ["0", "1", "2", "3"], ["0"]),
    (3, 1, ["0", "1", "2", "3"], ["3"]),
    (1, 2, ["0", "1", "2", "3"], ["2", "3"]),  # [N*g, (N+1)*g)
    (4, 1, ["0", "1", "2", "3"], ["0"]),  # more workers than GPUs (or a restarted gw4): wraps around
    (1, 2, ["0", "1", "2"], ["2", "0"]),
    (0, 4, ["0", "1"], ["0", "1"]),  # fewer than g: all of them
    (2, 0, ["0", "1"], ["0", "1"]),  # 0 disables
    (1, 1, ["GPU-aa", "GPU-bb"], ["GPU-bb"]),  # UUIDs kept as written
    (0, 1, [], []),
])
def test_worker_devices(index, g, visible, expected):
    assert worker_devices(index, g, visible) == expected


def test_worker_devices_rejects_negative():
    with pytest.raises(ValueError, match="gpus_per_worker must be >= 0, given -1"):
        worker_devices(0, -1, ["0"])


def test_visible_devices_from_the_environment():
    assert visible_devices({"CUDA_VISIBLE_DEVICES": "4, 5,7"}) == ["4", "5", "7"]
    assert visible_devices({"CUDA_VISIBLE_DEVICES": ""}) == []
    assert plan(3, 2, ["0", "1", "2", "3"]) == "gw0=0,1 gw1=2,3 gw2=0,1"


def _shard_in(pytester, monkeypatch, worker: str | None, devices: str, *args: str) -> pytest.RunResult:
    """An in-process run posing as xdist worker ``worker``; its test prints what CUDA_VISIBLE_DEVICES became."""
    for name in ("KVCM_SHARDED", "KVCM_HOST_CUDA_VISIBLE_DEVICES", "PYTEST_XDIST_WORKER"):
        monkeypatch.delenv(name, raising=False)
    if worker:
        monkeypatch.setenv("PYTEST_XDIST_WORKER", worker)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", devices)
    pytester.makepyfile("""
        import os
        def test_show():
            print("DEVICES", os.environ["CUDA_VISIBLE_DEVICES"], os.environ.get("KVCM_HOST_CUDA_VISIBLE_DEVICES"))
    """)
    return pytester.runpytest_inprocess("-p", "no:cacheprovider", "-p", "no:hypothesispytest", "-s", *args)


def test_worker_gets_its_slice(pytester, monkeypatch):
    _shard_in(pytester, monkeypatch, "gw1", "0,1,2,3", "--kvcm-gpus-per-worker=2").stdout.fnmatch_lines(
        ["*DEVICES 2,3 0,1,2,3"])


def test_default_is_one_gpu_per_worker_and_ini_sets_it(pytester, monkeypatch):
    _shard_in(pytester, monkeypatch, "gw2", "4,5,6,7").stdout.fnmatch_lines(["*DEVICES 6 4,5,6,7"])
    pytester.makeini("[pytest]\nkvcm_gpus_per_worker = 0\n")
    _shard_in(pytester, monkeypatch, "gw2", "4,5,6,7").stdout.fnmatch_lines(["*DEVICES 4,5,6,7 None"])


def test_not_a_worker_is_left_alone(pytester, monkeypatch):
    _shard_in(pytester, monkeypatch, None, "0,1").stdout.fnmatch_lines(["*DEVICES 0,1 None"])


def test_negative_gpus_per_worker_is_a_usage_error(pytester, monkeypatch):
    result = _shard_in(pytester, monkeypatch, "gw0", "0", "--kvcm-gpus-per-worker=-2")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "--kvcm-gpus-per-worker=-2: must be >= 0 (0 disables sharding)" in result.stderr.str()


@pytest.mark.post_merge
def test_real_xdist_workers_get_their_gpu_and_the_same_lane(pytester, monkeypatch):
    """Two real workers: each sees its own device, both select the lane the controller's machine picks (a
    simulated 2x H100 host), and the header shows the plan."""
    pytest.importorskip("xdist")
    for name in ("KVCM_SHARDED", "KVCM_HOST_CUDA_VISIBLE_DEVICES", "PYTEST_XDIST_WORKER"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    monkeypatch.setenv("KVCM_MACHINE_JSON", '{"gpu_count": 2, "gpu_name": "NVIDIA H100", "gpu_memory_gb": 85, "sm": 90}')
    pytester.makeini("[pytest]\naddopts = -p no:cacheprovider\n")
    pytester.mkdir("ci")
    (pytester.path / "ci/l0_h100.yml").write_text(textwrap.dedent("""
        l0_h100:
        - condition: {wildcards: {gpu: '*h100*'}}
          tests: [test_w.py::test_gpu, test_w.py::test_b]
    """))
    pytester.makepyfile(test_w="""
        import os, pytest
        def check():
            w = os.environ["PYTEST_XDIST_WORKER"]
            assert os.environ["CUDA_VISIBLE_DEVICES"] == {"gw0": "3", "gw1": "5"}[w]
        @pytest.mark.gpu
        def test_gpu(): check()
        def test_b(): check()
        def test_not_in_lane(): pass
    """)
    result = pytester.runpytest_subprocess("-n", "2", "--kvcm-lane=auto")
    result.stdout.fnmatch_lines([
        "kvcm sharding: 1 GPU(s) per worker, 2 worker(s) over 2 visible GPU(s): gw0=3 gw1=5",
        "*2 workers [[]2 items[]]*",
        "kvcm lane l0_h100 (auto: *): 2 tests selected from 1 blocks (1 matched)",
    ], consecutive=False)
    result.assert_outcomes(passed=2)
