"""The lane file format (docs/semantics.md 9): entry grammar, condition matching, file checks, ``auto`` picking."""

from __future__ import annotations

import pytest

from pytest_kvcm.lanes import Entry, condition_mismatch, load_lane, parse_entry, pick_auto


# ---------------------------------------------------------------- entry grammar


def test_parse_entry_all_markers_and_comment():
    e = parse_entry("suites/x.py::test_y[a b] TIMEOUT (5) ISOLATION XFAIL (bug #12 (rounding))  # see PR", "w")
    assert e == Entry("suites/x.py::test_y[a b]", "w", timeout_min=5.0, isolation=True, xfail="bug #12 (rounding)")
    assert e.path == "suites/x.py"
    assert parse_entry("./suites/managers/ SKIP(no fp8)", "w") == Entry("suites/managers", "w", skip="no fp8")
    assert parse_entry("   # only a comment", "w") is None


@pytest.mark.parametrize("line, message", [
    ("suites/x.py SLOW", "unknown marker 'SLOW'"),
    ("suites/x.py TIMEOUT", "TIMEOUT needs minutes > 0"),
    ("suites/x.py TIMEOUT (0)", "given '0'"),
    ("suites/x.py TIMEOUT (soon)", "given 'soon'"),
    ("suites/x.py SKIP", "SKIP needs a reason"),
    ("suites/x.py ISOLATION (yes)", "ISOLATION takes no argument"),
    ("suites/x.py XFAIL (open", "unbalanced brackets"),
])
def test_parse_entry_errors_name_the_problem(line, message):
    with pytest.raises(pytest.UsageError, match="^ci/l.yml block 1 entry 2: .*" + message.replace("(", r"\(")):
        parse_entry(line, "ci/l.yml block 1 entry 2")


def test_entry_matching_covers_dirs_files_params_and_classes():
    e = Entry("suites/a", "w")
    assert e.matches("suites/a/test_a.py::test_one") and not e.matches("suites/ab/test_x.py::test_one")
    f = Entry("suites/a/test_a.py::test_p", "w")
    assert f.matches("suites/a/test_a.py::test_p[1]") and not f.matches("suites/a/test_a.py::test_p2")
    assert Entry("t.py::TestK", "w").matches("t.py::TestK::test_m")


# ---------------------------------------------------------------- conditions

KEYS = {"system_gpu_count": 2, "gpu": "nvidia h100 80gb hbm3", "stage": "pre_merge"}


@pytest.mark.parametrize("cond, why", [
    ({}, None),
    ({"ranges": {"system_gpu_count": {"gte": 2, "lte": 2}}}, None),  # inclusive both ends
    ({"ranges": {"system_gpu_count": {"gte": 3}}}, "system_gpu_count 2 is not >= 3"),
    ({"ranges": {"system_gpu_count": {"lte": 1}}}, "system_gpu_count 2 is not <= 1"),
    ({"ranges": {"system_gpu_count": {"gt": 2}}}, "system_gpu_count 2 is not > 2"),
    ({"ranges": {"system_gpu_count": {"lt": 2}}}, "system_gpu_count 2 is not < 2"),
    ({"wildcards": {"gpu": ["*A100*", "*H100*"]}}, None),  # case-insensitive, any may match
    ({"wildcards": {"gpu": "*h200*"}}, "gpu 'nvidia h100 80gb hbm3' matches none of ['*h200*']"),
    ({"terms": {"stage": "pre_merge"}}, None),
    ({"terms": {"stage": "post_merge"}}, "stage 'pre_merge' is not 'post_merge'"),
    ({"terms": {"stage": ["nightly", "post_merge"]}}, "stage 'pre_merge' is not one of ['nightly', 'post_merge']"),
    ({"terms": {"rack": "a7"}, "ranges": {"numa": {"gte": 4}}}, None),  # keys the machine does not report match
])
def test_condition_matching(cond, why):
    assert condition_mismatch(cond, KEYS) == why


def test_load_lane_errors_name_file_block_and_field(tmp_path):
    bad = {
        "l0_x.yml": ("l0_y: []\n", "expected a context named 'l0_x' .*found \\['l0_y'\\]"),
        "l0_k.yml": ("l0_k:\n- {tests: [a], when: 1}\n", "l0_k.yml block 1: unknown key\\(s\\) \\['when'\\]"),
        "l0_c.yml": ("l0_c:\n- {condition: {range: {}}, tests: [a]}\n", "unknown condition section\\(s\\) \\['range'\\]"),
        "l0_b.yml": ("l0_b:\n- {condition: {ranges: {sm: {ge: 90}}}, tests: [a]}\n", "ranges.sm.ge: unknown bound"),
        "l0_t.yml": ("l0_t:\n- {tests: [a, 3]}\n", "block 1 entry 2: must be a string, got 3"),
    }
    for name, (text, message) in bad.items():
        (tmp_path / name).write_text(text)
        with pytest.raises(pytest.UsageError, match=message):
            load_lane(tmp_path / name)


def test_shipped_lane_files_parse_and_pick_by_machine(pytestconfig):
    ci = pytestconfig.rootpath / "ci"
    for lane in ("l0_cpu", "l0_h100", "l0_h200"):
        assert load_lane(ci / f"{lane}.yml").blocks, lane
    cpu = {"system_gpu_count": 0, "gpu": "none", "stage": "pre_merge"}
    assert pick_auto(ci, cpu)[0].name == "l0_cpu"
    assert pick_auto(ci, {**cpu, "system_gpu_count": 8, "gpu": "nvidia h100 80gb hbm3"})[0].name == "l0_h100"
    assert pick_auto(ci, {**cpu, "system_gpu_count": 8, "gpu": "nvidia h200"})[0].name == "l0_h200"
    with pytest.raises(pytest.UsageError, match=r"none of the \d+ lane file.*l0_cpu block 1: stage 'nightly' is not "
                       "'pre_merge'; l0_cpu block 2: stage 'nightly' is not 'post_merge'; .*l0_h100 block 1: "
                       "system_gpu_count 0 is not >= 1"):
        pick_auto(ci, {**cpu, "stage": "nightly"})
