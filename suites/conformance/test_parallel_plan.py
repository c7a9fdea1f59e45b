"""``kvcm plan`` on the two worked parallel deployments of docs/managers.md, every number worked out here from
TensorRT-LLM's per-rank sizing (``resource_manager.py`` ``KVCacheManager.__init__`` heads per rank,
``calculate_max_num_blocks`` with its allreduce MIN over ranks; ``mapping.py`` ``MappingBase.dp_size``).
"""

from __future__ import annotations

import json

import kvcm.cli

GiB = 2**30


def _plan(capsys, *args):
    rc = kvcm.cli.main(["plan", *args, "--json"])
    return rc, json.loads(capsys.readouterr().out)


def test_seed_oss_36b_at_tp8(capsys):
    """Seed-OSS-36B (64 layers, 8 KV heads of 128) at tp 8: ``(8 + 8 - 1) // 8 = 1`` head a rank, 2 x 64 x 128 x 2
    = 32768 bytes a token, a 32-token block 1 MiB; 72 GiB a rank = 73,728 blocks = 2,359,296 tokens (eight times
    one GPU's 294,912), 73,728 // 256 = 288 requests of 8,192. Without attention DP the 8 ranks hold the same
    tokens, so the deployment holds 2,359,296 tokens and B = 256 requests."""
    rc, out = _plan(capsys, "--model", "seed-oss-36b", "--tp", "8")
    assert rc == 0
    assert out["parallel"] == {"tp_size": 8, "pp_size": 1, "enable_attention_dp": False, "world_size": 8,
                               "attn_tp_size": 8, "dp_size": 1}
    for m in out["managers"]:
        assert [(g["num_blocks"], g["bytes_per_block"]) for g in m["final"]["groups"]] == [(73728, 2**20)]
        assert m["final"]["max_tokens"] == 2359296 and m["max_concurrency"] == 288
        assert m["stages"] == [{"pp_rank": 0, "first_layer": 0, "last_layer": 63, "num_layers": 64,
                                "kv_heads_per_layer": [1], "bytes_per_token": 32768, "pool_bytes": 72 * GiB,
                                "max_tokens": 2359296, "max_concurrency": 288}]
        assert m["deployment"] == {"gpus": 8, "kv_pools": 1, "binding_stage": 0, "max_tokens": 2359296,
                                   "requests_fit": 288, "max_concurrency": 256, "max_batch_size": 256,
                                   "pool_bytes": 8 * 72 * GiB}


def test_deepseek_v4_flash_at_tp8_with_attention_dp(capsys):
    """DeepSeek-V4-Flash at tp 8 with attention DP: the KV manager's tp_size is 1 (``enable_attention_dp``), so a
    rank's cache is one GPU's, 6,114,688 tokens and 746 requests of 8,192; ``dp_size = 8`` ranks each hold their
    own requests: 8 x 6,114,688 = 48,917,504 tokens, 8 x 256 = 2,048 requests at once (5,968 would fit)."""
    rc, one = _plan(capsys, "--model", "deepseek-v4-flash")
    rc_dp, out = _plan(capsys, "--model", "deepseek-v4-flash", "--tp", "8", "--attention-dp")
    assert rc == rc_dp == 0
    (single,), (m,) = one["managers"], out["managers"]
    rank = {k: v for k, v in m["final"].items() if k not in ("pp_rank", "num_layers", "bytes_per_token")}
    assert rank == single["final"] and m["max_concurrency"] == single["max_concurrency"] == 746
    assert m["final"]["max_tokens"] == 6114688
    assert m["deployment"] == {"gpus": 8, "kv_pools": 8, "binding_stage": 0, "max_tokens": 48917504,
                               "requests_fit": 5968, "max_concurrency": 2048, "max_batch_size": 2048,
                               "pool_bytes": 8 * m["final"]["pool_bytes"]}


def test_deepseek_v4_flash_at_tp8_without_attention_dp_replicates_the_latent(capsys):
    """Without attention DP every role of DeepSeek-V4 is one latent head (``num_kv_heads=1``, as ``_util.py``
    builds MLA caches): each of the 8 ranks stores all of it, so a rank holds what one GPU holds and the
    deployment no more than one rank: 6,114,688 tokens. That is why V4 is served with attention DP."""
    rc, out = _plan(capsys, "--model", "deepseek-v4-flash", "--tp", "8")
    (m,) = out["managers"]
    assert rc == 0 and m["final"]["max_tokens"] == 6114688 and m["deployment"]["max_tokens"] == 6114688
    assert m["deployment"]["kv_pools"] == 1 and m["deployment"]["max_concurrency"] == 256


def test_the_stage_with_the_fewest_tokens_binds(capsys):
    """Seed-OSS-36B at tp 4 x pp 3: stage 0 holds 22 layers (22528 bytes a token: 72 GiB // 720,896 = 107,240 blocks =
    3,431,680 tokens), stages 1, 2 hold 21 (21504 bytes; 72 GiB would be 3,595,104 tokens). A request needs room on
    every stage: the deployment holds stage 0's 3,431,680. V1's ``calculate_max_num_blocks`` reduces ``max_tokens``
    with MIN over every rank before counting blocks, so stages 1, 2 allocate 107,240 blocks too (107,240 x 32 x
    21504 bytes); V2's ranks agree on a byte quota instead, and each stage keeps its own 72 GiB pool."""
    rc, out = _plan(capsys, "--model", "seed-oss-36b", "--tp", "4", "--pp", "3")
    v1, v2 = out["managers"]
    assert rc == 0
    assert [(s["num_layers"], s["bytes_per_token"], s["max_tokens"], s["pool_bytes"]) for s in v1["stages"]] == [
        (22, 22528, 3431680, 107240 * 32 * 22528), (21, 21504, 3431680, 107240 * 32 * 21504),
        (21, 21504, 3431680, 107240 * 32 * 21504)]
    assert [s["max_tokens"] for s in v2["stages"]] == [3431680, 3595104, 3595104]
    for m in (v1, v2):
        assert (m["deployment"]["binding_stage"], m["deployment"]["max_tokens"]) == (0, 3431680)
