"""``kvcm plan --host-cache-size GIB --prefix-tokens T`` (``kvcm/plan_host_tier.py``): V1's host pool and V2's host
level beside the GPU pool, and a prefix set's cost with and without it."""

from __future__ import annotations

import json

import pytest

import kvcm.cli

BASE = ["plan", "--model", "qwen3-0.6b", "--free-gib", "4", "--max-gpu-total-gib", "1", "-B", "8", "-S", "2048",
        "--kvcm-version", "both"]


def plan(capsys, *extra) -> dict:
    assert kvcm.cli.main(BASE + list(extra) + ["--json"]) == 0
    return json.loads(capsys.readouterr().out)


def tiers(result):
    return {m["kvcm_version"]: m.get("host_tier") for m in result["managers"]}


def test_host_pool_is_the_floor_of_its_bytes_over_a_block_for_v1_and_v2(capsys):
    """V1: ``floor(bytes / block bytes)`` secondary blocks a group. V2 (one full-attention group here): its host level
    of ``host_cache_size`` bytes, the same floor; it has no minimum offload priority or onboard switch."""
    result = plan(capsys, "--host-cache-size", "2")
    v1, v2 = tiers(result)["v1"], tiers(result)["v2"]
    assert v1["host_blocks"] == (2 * 2**30) // v1["bytes_per_block"] and v1["host_tokens"] == v1["host_blocks"] * 32
    assert v1["secondary_offload_min_priority"] == 30 and v1["onboard_blocks"] is True
    assert v2["modelled"] is True and v2["host_blocks_per_group"] == [(2 * 2**30) // v2["bytes_per_block"]]
    assert v2["host_blocks"] == v2["host_blocks_per_group"][0] and "secondary_offload_min_priority" not in v2


def test_deepseek_v4_plans_no_host_tier_and_says_why(capsys):
    """DeepSeek-V4 refuses host_cache_size (upstream's V4 offload is sparse history offload): the plan says so
    rather than sizing a host level the manager would refuse."""
    assert kvcm.cli.main(["plan", "--model", "deepseek-v4-flash", "--free-gib", "60", "-B", "4", "-S", "8192",
                          "--kvcm-version", "v2", "--host-cache-size", "10", "--json"]) == 0
    (tier,) = tiers(json.loads(capsys.readouterr().out)).values()
    assert tier["modelled"] is False and "sparse history offload" in tier["why"]


@pytest.mark.parametrize("scale, fits_gpu, fits_both", [(0.5, True, True), (2.0, False, True), (8.0, False, False)])
def test_a_prefix_set_costs_recompute_without_the_tier_and_copies_with_it(capsys, scale, fits_gpu, fits_both):
    """A set half the GPU pool is free either way; twice the GPU pool (inside GPU + host) is recomputed every pass
    without the tier and copied with it; beyond GPU + host it is recomputed either way."""
    v1 = tiers(plan(capsys, "--host-cache-size", "2"))["v1"]
    tokens = int(v1["gpu_tokens"] * scale)
    p = tiers(plan(capsys, "--host-cache-size", "2", "--prefix-tokens", str(tokens)))["v1"]["prefix_set"]
    assert (p["fits_gpu"], p["fits_gpu_and_host"]) == (fits_gpu, fits_both)
    assert p["recomputed_tokens_without_tier"] == (0 if fits_gpu else tokens)
    assert p["recomputed_tokens_with_tier"] == (0 if fits_both else tokens)
    assert (p["onboarded_blocks_with_tier"] > 0) == (fits_both and not fits_gpu)


@pytest.mark.parametrize("args, line", [(["--host-cache-size", "-1"], "--host-cache-size=-1.0 is invalid"),
                                        (["--host-cache-size", "nan"], "--host-cache-size"),
                                        (["--prefix-tokens", "5"], "--prefix-tokens=5 is invalid: needs --host-cache-size"),
                                        (["--host-cache-size", "1", "--prefix-tokens", "0"], "--prefix-tokens=0")])
def test_bad_host_tier_options_are_one_line(capsys, args, line):
    assert kvcm.cli.main(BASE + args) == 2
    err = capsys.readouterr().err
    assert line in err and err.count("\n") == 1


def test_the_text_names_the_option_and_both_costs(capsys):
    assert kvcm.cli.main(BASE + ["--host-cache-size", "2", "--prefix-tokens", "100000"]) == 0
    out = capsys.readouterr().out
    assert "host tier [--host-cache-size]" in out and "without the tier" in out and "with the tier" in out
