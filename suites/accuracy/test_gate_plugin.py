"""The gate fixtures end to end in a pytester session: failure message, modes, store rows, JUnit properties."""

import sqlite3
import xml.etree.ElementTree as ET

import pytest

REFS = """
org/tiny:
  - accuracy: 80.0
  - quant_algo: FP8
    kv_cache_quant_algo: FP8
    accuracy: 70.0
    sigma: 40
gsm8k-oracle:
  - accuracy: 100.0
"""


@pytest.fixture
def session(pytester):
    refs = pytester.mkdir("refs")
    (refs / "gsm8k.yaml").write_text(REFS)
    (refs / "gsm8k-arith.yaml").write_text(REFS)
    return pytester


def rows(pytester):
    con = sqlite3.connect(pytester.path / ".kvcm" / "results.sqlite")
    con.row_factory = sqlite3.Row
    return [dict(r) for r in con.execute("SELECT * FROM results ORDER BY id")]


def test_failure_message_names_score_threshold_theta_n_and_spec(session):
    session.makepyfile("""
        def test_gate(accuracy_gate):
            accuracy_gate("gsm8k", model="org/tiny", spec={"quant_algo": "FP8", "kv_cache_quant_algo": "FP8"},
                          score=61.5, num_samples=200)
    """)
    res = session.runpytest("--kvcm-references=refs", "--junitxml=out.xml")
    res.assert_outcomes(failed=1)
    out = res.stdout.str()
    # reference 70, sigma 40 (entry override), n=200: s = 4, threshold = 70 - 1.645 * 4 = 63.421
    for needle in ("gsm8k accuracy gate FAILED for org/tiny (gate mode)", "score 61.500 < threshold 63.421",
                   "reference 70.000", "theta 9.946", "n=200", "sigma=40",
                   "'quant_algo': 'FP8', 'kv_cache_quant_algo': 'FP8'", "entry 1 of 'org/tiny'"):
        assert needle in out, needle
    (row,) = rows(session)
    assert (row["metric"], row["value"], row["n"], row["passed"], row["model"]) == (
        "accuracy.gsm8k", 61.5, 200, 0, "org/tiny")
    assert row["threshold"] == pytest.approx(63.4206, abs=1e-4)
    assert row["test_id"] == "test_failure_message_names_score_threshold_theta_n_and_spec.py::test_gate"
    props = {p.get("name"): p.get("value") for p in ET.parse(session.path / "out.xml").iter("property")}
    assert '"passed": false' in props["kvcm:accuracy.gsm8k"] and '"n": 200' in props["kvcm:accuracy.gsm8k"]


def test_pass_and_missing_reference(session):
    session.makepyfile("""
        import pytest
        from pytest_kvcm.accuracy import ReferenceError

        def test_pass(accuracy_gate):
            out = accuracy_gate("gsm8k", model="org/tiny", score=79.0, num_samples=1319)
            assert out.passed and round(out.threshold.threshold, 3) == 76.797

        def test_unregistered(accuracy_gate):
            with pytest.raises(ReferenceError, match="org/tiny.*'spec_dec_algo': 'Eagle3'"):
                accuracy_gate("gsm8k", model="org/tiny", spec={"spec_dec_algo": "Eagle3"}, score=1, num_samples=1)
    """)
    session.runpytest("--kvcm-references=refs").assert_outcomes(passed=2)
    assert [r["passed"] for r in rows(session)] == [1]


def test_measure_mode_prints_the_entry_and_never_fails(session):
    session.makepyfile("""
        def test_measure(accuracy_gate):
            out = accuracy_gate("gsm8k", model="new/model", spec={"dtype": "float32"}, score=12.3456,
                                num_samples=48)
            assert out.passed is None
    """)
    res = session.runpytest("--kvcm-references=refs", "--kvcm-accuracy=measure")
    res.assert_outcomes(passed=1)
    res.stdout.fnmatch_lines(["*kvcm accuracy: measured entries to paste*", "*new/model*",
                              "new/model:", "  - dtype: float32", "    accuracy: 12.346",
                              "    num_samples: 48"])
    (row,) = rows(session)
    assert row["passed"] is None and row["threshold"] is None


def test_gsm8k_fixture_smoke_mode_on_the_embedded_set(session):
    pytest.importorskip("datasets")
    session.makepyfile("""
        from pytest_kvcm.accuracy.gsm8k import target_answer

        def test_smoke(gsm8k, kvcm_accuracy_mode):
            truth = {r["question"]: target_answer(r["answer"]) for r in gsm8k.data.test}
            def gen(prompts):
                return [" #### " + truth[p.rsplit("Question: ", 1)[1][:-len("\\nAnswer:")]] for p in prompts]
            result = gsm8k(gen, model="gsm8k-oracle", kvcm_version="v2")
            assert kvcm_accuracy_mode == "smoke" and gsm8k.task == "gsm8k-arith"
            assert (result.num_samples, result.score) == (16, 100.0)
    """)
    session.runpytest("--kvcm-references=refs", "--kvcm-accuracy=smoke").assert_outcomes(passed=1)
    (row,) = rows(session)
    assert (row["metric"], row["n"], row["passed"], row["kvcm_version"]) == ("accuracy.gsm8k-arith", 16, 1, "v2")
    assert '"dataset": "embedded"' in row["extra"] and '"mode": "smoke"' in row["extra"]


@pytest.mark.post_merge
def test_xdist_workers_share_one_run_id(session):
    pytest.importorskip("xdist")
    session.makepyfile("""
        import pytest

        @pytest.mark.parametrize("i", range(6))
        def test_rec(kvcm_results, i):
            kvcm_results.record(metric="parity.first_diff", value=i, n=i)
    """)
    session.runpytest_subprocess("-n", "2", "-p", "xdist").assert_outcomes(passed=6)
    got = rows(session)
    assert sorted(r["value"] for r in got) == [0, 1, 2, 3, 4, 5]
    assert len({r["run_id"] for r in got}) == 1


def test_bad_mode_is_a_usage_error(session):
    session.makepyfile("def test_x(): pass")
    res = session.runpytest("--kvcm-accuracy=strict")
    assert res.ret != 0
    res.stderr.fnmatch_lines(["*invalid choice: 'strict'*"])
