"""Inputs that were accepted and quietly meant something else are refused with one line naming them.

Before: ``record(time='yesterday')`` was stored (and that one row then made the dashboard refuse the whole
store); ``kvcm plan --tp 1000000 --attention-dp`` planned "82,000,000 requests"; ``-o kvcm_reuse=`` meant "on",
``--kvcm-inject=`` ran with no defect, ``--kvcm-durations`` naming a missing file split the lane as if no test had
a recording; ``--draft-model ''`` planned without a draft and a draft larger than its target was planned;
``pp_rank`` without a mapping was ignored; ``count_reusable_blocks`` answered for a prompt no request can hold;
``--max-tokens 5`` said "the budget is 0" on V1 and "3670016 bytes" on V2; the dashboard showed "0/0 gate
results passing" in green.
"""

from __future__ import annotations

import pytest

import kvcm
import kvcm.cli
from kvcm.config import KvCacheConfig
from kvcm.model_spec import ModelSpec
from pytest_kvcm.dashboard import main as dashboard
from pytest_kvcm.results import ResultsStore


@pytest.mark.parametrize("kwargs, fragment", [
    ({"time": "yesterday"}, "time='yesterday' must be seconds since the epoch (a number), not str"),
    ({"time": -1.0}, "time=-1.0 must be seconds since the epoch in [0, 253402300799]"),
    ({"time": 1e20}, "time=1e+20 must be seconds since the epoch in [0, 253402300799]"),
    ({"time": float("nan")}, "time=nan must be seconds since the epoch in [0, 253402300799]"),
    ({"passed": "no"}, "passed='no' must be True, False or None"),
    ({"passed": 2}, "passed=2 must be True, False or None"),
    ({"model": 3}, "model=3 must be a string or None"),
    ({"lane": ["l0"]}, "lane=['l0'] must be a string or None"),
    ({"extra": [1, 2]}, "extra=[1, 2] must be a dict (a JSON object) or None"),
], ids=["time_text", "time_negative", "time_far_future", "time_nan", "passed_text", "passed_two", "model_int",
        "lane_list", "extra_list"])
def test_record_validates_every_column_on_write(tmp_path, kwargs, fragment):
    with ResultsStore(tmp_path / "s.db") as store:
        with pytest.raises(ValueError) as exc:
            store.record("m", 1.0, **kwargs)
        assert str(exc.value).startswith("record('m'): ") and fragment in str(exc.value)
        assert store.query() == []  # nothing stored


def test_record_keeps_a_good_time_given(tmp_path):
    with ResultsStore(tmp_path / "s.db") as store:
        store.record("m", 1.0, time=1.7e9, passed=1)
        assert [(r["time"], r["passed"]) for r in store.query()] == [(1.7e9, True)]


def test_dashboard_with_no_gate_results_says_none_in_a_neutral_tile(tmp_path):
    with ResultsStore(tmp_path / "s.db") as store:
        store.record("parity.first_diff", 3.0, test_id="t::p")
    assert dashboard(["--results", str(tmp_path / "s.db"), "--out", str(tmp_path / "d.html")]) == 0
    page = (tmp_path / "d.html").read_text()
    assert '<div class="tile"><b>none</b>gate results recorded</div>' in page and "0/0" not in page


# ----------------------------------------------------------------------------------------------- kvcm plan
PLAN = [
    ("tp_a_million_with_attention_dp", ["--tp", "1000000", "--attention-dp"],
     "--tp=1000000 is invalid: must be >= 1 and <= 65536 (kvcm.MAX_WORLD_SIZE GPUs in one deployment; TensorRT-LLM "
     "bounds only pp_size by the layers and tp x pp by its int32 world size)"),
    ("world_over_the_bound", ["--tp", "256", "--pp", "512", "--attention-dp", "--model", "seed-oss-36b"],
     "--tp x --pp=131072 is invalid: must be <= 65536"),
    ("pp_absurd", ["--pp", "10000000"], "--pp=10000000 is invalid: must be >= 1 and <= 65536"),
    ("draft_model_empty", ["--draft-model", "", "-D", "2"],
     "--draft-model='' is invalid: is empty; give an embedded config's name or a config.json path"),
    ("draft_larger_than_target", ["--model", "qwen3-0.6b", "--draft-model", "seed-oss-36b", "-D", "2", "-S", "4096"],
     "--draft-model='seed-oss-36b' is invalid: caches 65,536 KV values a token, more than the target qwen3-0.6b's "
     "28,672: a draft must be the smaller model"),
    ("max_tokens_under_a_block", ["--max-tokens", "5"],
     "--max-tokens=5 is invalid: must be >= 32, one block of 32 tokens [--tpb]"),
    ("max_tokens_under_a_block_v1", ["--max-tokens", "31", "--kvcm-version", "v1"],
     "--max-tokens=31 is invalid: must be >= 32, one block of 32 tokens [--tpb]"),
    ("max_tokens_under_a_block_tpb", ["--max-tokens", "100", "--tpb", "128", "--kvcm-version", "v2"],
     "--max-tokens=100 is invalid: must be >= 128, one block of 128 tokens [--tpb]"),
]


@pytest.mark.parametrize("args, fragment", [c[1:] for c in PLAN], ids=[c[0] for c in PLAN])
def test_plan_refuses_what_it_used_to_plan(capsys, args, fragment):
    assert kvcm.cli.main(["plan", *args]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and fragment in err, err


def test_plan_accepts_the_largest_world_and_a_smaller_draft(capsys):
    assert kvcm.cli.main(["plan", "--model", "llama-3-8b", "--draft-model", "qwen3-0.6b", "-D", "2", "-S", "4096"]) == 0
    assert kvcm.cli.main(["plan", "--tp", "65536", "--attention-dp", "--json"]) == 0
    assert "65536" in capsys.readouterr().out


# ----------------------------------------------------------------------------------------------- pytest options
OPTIONS = [
    ("reuse_ini_empty", ["-o", "kvcm_reuse="], "kvcm_reuse='' is invalid: choose one of on, off, both"),
    ("version_ini_empty", ["-o", "kvcm_version="], "kvcm_version='' is invalid: choose one of "),
    ("inject_empty", ["--kvcm-inject="], "--kvcm-inject='': names no defect; give one of the "),
    ("inject_blank", ["--kvcm-inject= "], "--kvcm-inject=' ': names no defect"),
]


@pytest.mark.parametrize("args, fragment", [c[1:] for c in OPTIONS], ids=[c[0] for c in OPTIONS])
def test_pytest_option_that_meant_something_else_is_a_usage_error(pytester, args, fragment):
    pytester.makepyfile(test_ok="def test_ok():\n    pass\n")
    (pytester.path / "ci").mkdir()
    (pytester.path / "ci" / "l0_cpu.yml").write_text("l0_cpu:\n  - tests: [test_ok.py]\n")
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "-p", "no:randomly", *args)
    text = result.stdout.str() + result.stderr.str()
    assert result.ret == pytest.ExitCode.USAGE_ERROR, text
    assert fragment in text and "passed" not in text and "INTERNALERROR" not in text


# ----------------------------------------------------------------------------------------------- managers
@pytest.mark.parametrize("kvcm_version", ["v1", "v2"])
def test_pp_rank_without_a_mapping(kvcm_version):
    with pytest.raises(kvcm.ConfigError) as exc:
        kvcm.create_kv_cache_manager(kvcm_version, ModelSpec.uniform(2, 2, 16), KvCacheConfig(max_tokens=2048),
                                     max_batch_size=4, max_seq_len=256, device="meta", pp_rank=1)
    assert str(exc.value).startswith("pp_rank=1 is invalid: needs a mapping (kvcm.Mapping(pp_size=...))")


@pytest.mark.parametrize("kvcm_version", ["v1", "v2"])
def test_count_reusable_blocks_of_a_prompt_longer_than_max_seq_len(kvcm_version):
    mgr = kvcm.create_kv_cache_manager(kvcm_version, ModelSpec.uniform(2, 2, 16), KvCacheConfig(max_tokens=2048),
                                       max_batch_size=4, max_seq_len=256, device="meta")
    assert mgr.count_reusable_blocks(list(range(256))) == 0  # the longest a request holds: an answer
    with pytest.raises(kvcm.ConfigError) as exc:
        mgr.count_reusable_blocks(list(range(257)))
    assert str(exc.value) == "token_ids=257 is invalid: must be >= 0 and <= 256 (max_seq_len; the value is the length)"
