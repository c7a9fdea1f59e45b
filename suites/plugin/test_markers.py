"""Markers and machine facts: registration, GPU requirement skips and their reasons, simulated machines."""

from __future__ import annotations

import json

import pytest

from pytest_kvcm.machine import MachineInfo, detect, from_override
from pytest_kvcm.markers import SLOW_SKIP, unmet_reason

H100x2 = json.dumps({"gpu_count": 2, "gpu_name": "NVIDIA H100 80GB HBM3", "gpu_memory_gb": 85.0, "sm": 90})
A10 = json.dumps({"gpu_names": ["NVIDIA A10"], "gpu_memory_gb": [23.7], "sm": [86]})

GPU_TESTS = """
    import pytest
    @pytest.mark.gpu
    def test_any_gpu(): pass
    @pytest.mark.gpu(count=2, min_memory_gb=80, min_sm=90)
    def test_two_big(): pass
    @pytest.mark.gpu(4)
    def test_four(): pass
    @pytest.mark.cpu_only
    def test_cpu(): pass
"""


def run(pytester: pytest.Pytester, *args: str) -> pytest.HookRecorder:
    pytester.makeini("[pytest]\naddopts = -p no:cacheprovider -p no:hypothesispytest\n")
    return pytester.inline_run(*args)


def skip_reasons(rec: pytest.HookRecorder) -> dict[str, str]:
    """{test name: skip reason} of the tests skipped at setup."""
    return {r.nodeid.split("::")[-1]: r.longrepr[2].removeprefix("Skipped: ")
            for r in rec.getreports("pytest_runtest_logreport") if r.skipped}


def test_plugin_is_active_in_pytester_runs(pytester):
    result = pytester.runpytest_inprocess("--help")
    result.stdout.fnmatch_lines(["*--kvcm-machine=JSON_OR_PATH*", "*--kvcm-lane=NAME*", "*--kvcm-gpus-per-worker=G*"])


def test_all_markers_are_registered_for_strict_markers(pytester):
    pytester.makepyfile("""
        import pytest
        @pytest.mark.cpu_only
        @pytest.mark.accuracy
        @pytest.mark.slow
        @pytest.mark.kvcm_versions("v1", "v2")
        def test_marked(): pass
        @pytest.mark.gpu(count=1, min_memory_gb=None, min_sm=None)
        def test_gpu(): pass
    """)
    rec = run(pytester, "--strict-markers", "--kvcm-machine", H100x2, "--kvcm-slow")
    rec.assertoutcome(passed=2)
    result = pytester.runpytest_inprocess("--markers")
    result.stdout.fnmatch_lines(["@pytest.mark.gpu(count=1, min_memory_gb=None, min_sm=None): *",
                                 "@pytest.mark.kvcm_versions(*versions): *"], consecutive=False)


SLOW_TESTS = """
    import pytest
    @pytest.mark.slow
    def test_model_gate(): pass
    def test_quick(): pass
"""


def test_slow_tests_leave_the_pre_merge_run_and_skip_with_a_reason_elsewhere(pytester):
    """The default stage (pre_merge) deselects them: they belong to post_merge (lanes/merge_stage.py); a stage of a
    lane file's own (nightly) keeps them collected and skips them with the reason naming the opt-in."""
    pytester.makepyfile(SLOW_TESTS)
    rec = run(pytester)
    rec.assertoutcome(passed=1, skipped=0)
    assert [r.nodeid.split("::")[-1] for r in rec.getcalls("pytest_deselected")[0].items] == ["test_model_gate"]
    rec = run(pytester, "--kvcm-stage=nightly")
    assert skip_reasons(rec) == {"test_model_gate": SLOW_SKIP}
    rec.assertoutcome(passed=1, skipped=1)
    assert "--kvcm-slow" in SLOW_SKIP and "-m slow" in SLOW_SKIP


@pytest.mark.parametrize("args, ini, passed", [
    (["--kvcm-slow"], None, 2),
    (["-m", "slow"], None, 1),               # -m naming slow is an opt-in, and selects only them
    (["-m", "slow or not slow"], None, 2),
    ([], "kvcm_slow = true", 2),
])
def test_slow_tests_run_when_asked_for(pytester, args, ini, passed):
    pytester.makepyfile(SLOW_TESTS)
    if ini:
        pytester.makeini(f"[pytest]\naddopts = -p no:cacheprovider -p no:hypothesispytest\n{ini}\n")
        rec = pytester.inline_run(*args)
    else:
        rec = run(pytester, *args)
    rec.assertoutcome(passed=passed)


def test_gpu_tests_skip_on_a_cpu_machine_naming_need_and_have(pytester):
    pytester.makepyfile(GPU_TESTS)
    rec = run(pytester, "--kvcm-machine", "{}")
    assert skip_reasons(rec) == {
        "test_any_gpu": "needs 1 GPU(s); this machine has 0 GPU(s)",
        "test_two_big": "needs 2 GPU(s) with >= 80 GB, sm >= 90; this machine has 0 GPU(s)",
        "test_four": "needs 4 GPU(s); this machine has 0 GPU(s)",
    }
    rec.assertoutcome(passed=1, skipped=3)


def test_gpu_tests_run_on_a_simulated_h100_machine(pytester):
    pytester.makepyfile(GPU_TESTS)
    rec = run(pytester, "--kvcm-machine", H100x2)
    assert skip_reasons(rec) == {
        "test_four": "needs 4 GPU(s); this machine has 2 GPU(s): NVIDIA H100 80GB HBM3 (85.0 GB, sm 90) x2"}
    rec.assertoutcome(passed=3, skipped=1)


def test_too_little_memory_or_too_low_sm_skips(pytester, monkeypatch, tmp_path):
    pytester.makepyfile("""
        import pytest
        @pytest.mark.gpu(min_memory_gb=40)
        def test_mem(): pass
        @pytest.mark.gpu(min_sm=90)
        def test_sm(): pass
        @pytest.mark.gpu(min_memory_gb=20, min_sm=80)
        def test_fits(): pass
    """)
    machine = tmp_path / "a10.json"
    machine.write_text(A10)
    monkeypatch.setenv("KVCM_MACHINE_JSON", str(machine))  # the environment variable, holding a file path
    rec = run(pytester)
    have = "this machine has 1 GPU(s): NVIDIA A10 (23.7 GB, sm 86)"
    assert skip_reasons(rec) == {"test_mem": f"needs 1 GPU(s) with >= 40 GB; {have}",
                                 "test_sm": f"needs 1 GPU(s) sm >= 90; {have}"}
    rec.assertoutcome(passed=1, skipped=2)


def test_gpu_only_skips_cpu_only_tests(pytester):
    pytester.makepyfile(GPU_TESTS)
    rec = run(pytester, "--kvcm-machine", H100x2, "--kvcm-gpu-only")
    assert skip_reasons(rec)["test_cpu"] == "cpu_only test; --kvcm-gpu-only skips cpu_only tests"


@pytest.mark.parametrize("mark, message", [
    ("gpu(0)", "gpu(count=0): count must be an integer >= 1"),
    ("gpu(count='2')", "gpu(count='2'): count must be an integer >= 1"),
    ("gpu(1, 2)", "gpu() takes at most one positional argument (count), given (1, 2)"),
    ("gpu(mem=80)", "gpu() got unknown argument(s) ['mem']; known: ['count', 'min_memory_gb', 'min_sm']"),
    ("gpu(min_sm=9.0)", "gpu(min_sm=9.0): min_sm is an sm number such as 90"),
    ("gpu(min_memory_gb=-1)", "gpu(min_memory_gb=-1): must be a number of GB > 0"),
])
def test_bad_gpu_marks_are_usage_errors_naming_the_argument(pytester, mark, message):
    pytester.makepyfile(f"import pytest\n@pytest.mark.{mark}\ndef test_x(): pass\n")
    pytester.makeini("[pytest]\naddopts = -p no:cacheprovider -p no:hypothesispytest\n")
    result = pytester.runpytest_inprocess("--kvcm-machine", "{}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert f"test_bad_gpu_marks_are_usage_errors_naming_the_argument.py::test_x: {message}" in result.stderr.str()


# ---------------------------------------------------------------- machine facts


def test_condition_keys_of_cpu_and_gpu_machines():
    cpu = from_override("{}", stage="post_merge")
    keys = cpu.as_condition_keys()
    assert {k: keys[k] for k in ("system_gpu_count", "gpu_count", "gpu", "gpu_memory_gb", "sm", "stage", "backend")} \
        == {"system_gpu_count": 0, "gpu_count": 0, "gpu": "none", "gpu_memory_gb": 0, "sm": 0,
            "stage": "post_merge", "backend": "cpu"}
    gpu = from_override(json.dumps({"gpu_names": ["NVIDIA H200", "NVIDIA H200"], "gpu_memory_gb": [143.8, 140.1],
                                    "sm": 90, "system_gpu_count": 8, "keys": {"rack": "a7"}, "torch": "2.11"}))
    keys = gpu.as_condition_keys()
    assert (keys["gpu"], keys["gpu_count"], keys["system_gpu_count"], keys["gpu_memory_gb"], keys["sm"],
            keys["backend"], keys["rack"], keys["torch"]) == ("nvidia h200", 2, 8, 140.1, 90, "cuda", "a7", "2.11")
    assert gpu.describe() == "2 GPU(s): NVIDIA H200 (143.8 GB, sm 90), NVIDIA H200 (140.1 GB, sm 90)"
    assert MachineInfo.from_dict(gpu.to_dict()) == gpu


@pytest.mark.parametrize("text, message", [
    ('{"gpus": 2}', r"unknown field\(s\) \['gpus'\]"),
    ('{"gpu_count": 2, "sm": [90]}', r"sm lists 1 value\(s\) for 2 GPU\(s\)"),
    ('{"gpu_count": 3, "gpu_names": ["a", "b"]}', r"gpu_count=3 but gpu_names lists 2 GPU\(s\)"),
    ("{not json", "invalid JSON"),
    ("/no/such/machine.json", "neither a JSON object nor an existing file"),
])
def test_bad_machine_override_names_the_field(text, message):
    with pytest.raises(pytest.UsageError, match=message):
        from_override(text)


def test_detect_reads_torch():
    torch = pytest.importorskip("torch")
    info = detect()
    expected = torch.cuda.device_count() if torch.cuda.is_available() else 0
    assert info.gpu_count == expected
    if expected:
        p = torch.cuda.get_device_properties(0)
        assert info.gpu_sm[0] == p.major * 10 + p.minor and info.gpu_memory_gb[0] == round(p.total_memory / 1e9, 1)


def test_unmet_reason_names_the_worker_when_sharded(monkeypatch):
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw3")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    one = MachineInfo(gpu_names=("NVIDIA H100",), gpu_memory_gb=(85.0,), gpu_sm=(90,), source="torch")
    assert unmet_reason(one, 2, None, None) == \
        "needs 2 GPU(s); this worker (gw3, CUDA_VISIBLE_DEVICES='3') has 1 GPU(s): NVIDIA H100 (85.0 GB, sm 90)"
    assert unmet_reason(one, 1, 80, 90) is None
