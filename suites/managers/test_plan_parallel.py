"""``kvcm plan --tp/--pp/--attention-dp`` end to end: the text a planner reads, and a model with fewer KV heads
than ranks; the numbers are worked out here (the upstream-cited cases are in suites/conformance/test_parallel_*)."""

from __future__ import annotations

import json


import kvcm.cli


def test_fewer_kv_heads_than_ranks_are_replicated(capsys):
    """Gemma-3-270M has 1 KV head (of 256) and 4 query heads: at tp 4 each rank keeps the one head, so a rank's
    token costs what one GPU's does, 18 x 2 x 256 x 2 = 18432 bytes, and the 4 ranks hold the same tokens."""
    assert kvcm.cli.main(["plan", "--model", "gemma-3-270m", "--tp", "4", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert kvcm.cli.main(["plan", "--model", "gemma-3-270m", "--json"]) == 0
    single = json.loads(capsys.readouterr().out)
    for m, one in zip(out["managers"], single["managers"]):
        assert m["stages"][0]["kv_heads_per_layer"] == [1] and m["stages"][0]["bytes_per_token"] == 18432
        assert m["final"]["max_tokens"] == one["final"]["max_tokens"] == m["deployment"]["max_tokens"]


def test_text_shows_the_rank_and_the_deployment(capsys):
    assert kvcm.cli.main(["plan", "--model", "seed-oss-36b", "--tp", "8", "--kvcm-version", "v1"]) == 0
    text = capsys.readouterr().out
    assert "V1 per rank: KV cache 72.0 GiB = 2,359,296 tokens at S=8,192" in text
    assert "  deployment on 8 GPUs: 2,359,296 tokens (the 8 TP ranks of a stage hold the same tokens): 256 " \
           "requests at once (B=256 binds; the pools would hold 288)" in text
    assert "    stage 0: layers 0-63 (64), 1 KV head a layer, 32.0 KiB a token: 72.0 GiB = 2,359,296 tokens" in text
    assert "8 TP x 1 PP = 8 GPUs [--tp, --pp], attention DP off" in text


def test_attention_dp_text_multiplies_by_the_ranks(capsys):
    assert kvcm.cli.main(["plan", "--model", "deepseek-v4-flash", "--tp", "8", "--attention-dp"]) == 0
    text = capsys.readouterr().out
    assert "deployment on 8 GPUs: 8 x 6,114,688 = 48,917,504 tokens (8 attention-DP ranks, each its own pool and " \
           "requests): 8 x 256 = 2,048 requests at once" in text


def test_one_gpu_options_leave_the_plan_as_it_was(capsys):
    """``--tp 1 --pp 1`` is the default plan: no parallel fields, the README's `kvcm plan` text unchanged."""
    assert kvcm.cli.main(["plan", "--json"]) == 0
    default = capsys.readouterr().out
    assert kvcm.cli.main(["plan", "--tp", "1", "--pp", "1", "--json"]) == 0
    assert capsys.readouterr().out == default and '"parallel"' not in default


def test_tp_is_not_read_as_tpb(capsys):
    """argparse prefix matching once read ``--tp 8`` as ``--tpb 8``; prefixes are off, and ``--tp`` is its own."""
    assert kvcm.cli.main(["plan", "--model", "seed-oss-36b", "--tp", "8", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["tokens_per_block"] == 32 and out["parallel"]["tp_size"] == 8
    assert kvcm.cli.main(["plan", "--max-tok", "5"]) == 2   # a prefix of --max-tokens is no longer read as it
    assert "unrecognized arguments: --max-tok 5" in capsys.readouterr().err


def test_pipeline_stages_share_v1_tokens(capsys):
    """Seed-OSS-36B at tp 4 x pp 3 (22, 21, 21 layers of 2 KV heads): V1 sizes every stage for stage 0's 3,431,680
    tokens, so the 21-layer stages use 107,240 x 32 x 21504 bytes = 68.7 GiB of their 72 GiB."""
    assert kvcm.cli.main(["plan", "--model", "seed-oss-36b", "--tp", "4", "--pp", "3", "--kvcm-version", "v1"]) == 0
    text = capsys.readouterr().out
    assert "    stage 0: layers 0-21 (22), 2 KV heads a layer, 22.0 KiB a token: 72.0 GiB = 3,431,680 tokens" in text
    for stage, layers in ((1, "22-42"), (2, "43-63")):
        assert (f"    stage {stage}: layers {layers} (21), 2 KV heads a layer, 21.0 KiB a token: 68.7 GiB = 3,431,680 "
                "tokens, 418 requests of S=8,192") in text
