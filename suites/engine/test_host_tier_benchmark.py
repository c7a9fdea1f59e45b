"""The host-tier benchmark (``benchmarks/host_tier.py``) in its CPU smoke form, and how it splits round 2's time
between the steps that carried prefill and those that only decoded. The GPU figures come from the same code."""
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import host_tier  # noqa: E402


def test_round_two_is_split_into_prefill_and_decode_steps():
    """A step's period runs to the next step's start (the host's clock off CUDA), the last one's to the end of the
    round; a step with any prefill chunk is a prefill step."""
    steps = [SimpleNamespace(host=h, prefill_tokens=p) for h, p in ((1.0, 40), (1.5, 0), (1.75, 8), (2.5, 0))]
    split = host_tier.step_times(steps, None, 3.0, cuda=False)
    assert split == {"prefill_seconds": 0.5 + 0.75, "decode_seconds": 0.25 + 0.5, "prefill_steps": 2,
                     "decode_steps": 2}


@pytest.mark.cpu_only
@pytest.mark.post_merge
def test_quick_run_reports_both_versions_with_and_without_the_tier(tmp_path):
    """Six prefixes through a GPU pool of two prompts: with the tier round 2 brings blocks back and computes less,
    without it everything is recomputed; every arm gives the same tokens (fp32)."""
    rc, report = host_tier.main(["--quick", "--json", str(tmp_path / "host_tier.json")])
    assert rc == 0 and (tmp_path / "host_tier.json").exists()
    by = {(r["kvcm_version"], bool(r["host_cache_size"])): r for r in report["arms"]}
    assert sorted(by) == [("v1", False), ("v1", True), ("v2", False), ("v2", True)]
    for version in ("v1", "v2"):
        tier, none = by[(version, True)], by[(version, False)]
        assert tier["onboarded_blocks"] > 0 and none["onboarded_blocks"] == 0
        assert tier["prefill_tokens_computed"] < none["prefill_tokens_computed"] == none["prompt_tokens"]
        for row in (tier, none):
            assert row["prefill_steps"] > 0 and row["decode_steps"] > 0
            assert 0 < row["prefill_seconds"] + row["decode_seconds"] <= row["round2_seconds"]
    assert set(report["prompts_equal_to_the_first_arm"].values()) == {report["prompts"]}
    assert report["copy_seconds_per_block"] > 0
