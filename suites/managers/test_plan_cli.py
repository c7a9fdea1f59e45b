"""`kvcm plan` end to end on shipped configs; every number checked against arithmetic written out here."""

from __future__ import annotations

import json
import subprocess
import sys

import kvcm.cli

GiB = 2**30


def _plan(capsys, *args):
    rc = kvcm.cli.main(["plan", *args, "--json"])
    return rc, json.loads(capsys.readouterr().out)


def test_plan_qwen3_defaults(capsys):
    # defaults: free 80 GiB, fraction 0.9, B = 256, S = N = 8192, tpb 32, both versions.
    # Qwen3-0.6B: 28 x 2 x 8 x 128 x 2 = 114688 bytes a token; x 32 = 3670016 bytes (3.5 MiB) a block.
    # budget int(0.9 x 80 GiB) = 77309411328 = 72 GiB; 72 x 1024 MiB / 3.5 MiB = 21065.14 -> 21065 blocks.
    rc, out = _plan(capsys, "--model", "qwen3-0.6b")
    assert rc == 0
    assert (out["max_batch_size"], out["max_seq_len"], out["max_num_tokens"]) == (256, 8192, 8192)
    assert [m["version"] for m in out["managers"]] == ["v1", "v2"]
    for m in out["managers"]:
        final = m["final"]
        assert final["budget_bytes"] == 77309411328
        assert [(g["num_blocks"], g["bytes_per_block"]) for g in final["groups"]] == [(21065, 3670016)]
        assert final["pool_bytes"] == 21065 * 3670016 <= final["budget_bytes"]  # 77309386240
        assert final["max_tokens"] == 21065 * 32  # 674080
        assert m["max_concurrency"] == 82  # 8192 / 32 = 256 blocks a request; 21065 // 256 = 82
        assert [w["skipped"] for w in m["warmup"]] == [[], []]
        assert [w["planned"] for w in m["warmup"]] == [9, 9]  # 1, 2, 4, ..., 256 (N // 1 = 8192 does not bind)
    v1, v2 = out["managers"]
    assert v1["final"]["constraints"] == [] and v1["estimation"]["typical_step"] is None
    context = [{"name": "context", "requests": [{"count": 1, "capacity": 8192, "history": 0}]}]  # (N + E, 0)
    assert v2["final"]["constraints"] == context == v2["estimation"]["constraints"]
    # estimation typical step with avg_seq_len = S: (N, 0) + 255 x (S, S - 1)
    assert v2["estimation"]["typical_step"] == [{"count": 1, "capacity": 8192, "history": 0},
                                                {"count": 255, "capacity": 8192, "history": 8191}]
    assert v2["final"]["typical_step"] is None


def test_plan_llama3_v2_limits(capsys):
    # Llama-3-8B, 131072 bytes a token, 4 MiB a block; free 40 GiB -> budget 36 GiB = 9216 blocks;
    # max tokens 9216 x 32 = 294912; S = 131072 needs 4096 blocks: 9216 // 4096 = 2 requests at once.
    rc, out = _plan(capsys, "--model", "llama-3-8b", "--version", "v2", "--free-gib", "40", "-B", "256",
                    "-S", "131072", "-N", "8192", "-E", "2")
    assert rc == 0
    (m,) = out["managers"]
    assert [g["num_blocks"] for g in m["final"]["groups"]] == [9216]
    assert m["final"]["max_tokens"] == 294912
    assert m["max_concurrency"] == 2
    assert [c["name"] for c in m["estimation"]["constraints"]] == ["context"]  # no longest_decode
    assert m["final"]["constraints"][0]["requests"] == [{"count": 1, "capacity": 8194, "history": 0}]  # N + E


def test_plan_max_tokens_and_text_output(capsys):
    # --max-tokens 1000 on V1: ceil(1000 / 32) = 32 blocks, the final budget 32 x 4 MiB
    rc = kvcm.cli.main(["plan", "--model", "llama-3-8b", "--version", "v1", "--max-tokens", "1000", "-B", "4",
                        "-S", "512", "-N", "512"])
    text = capsys.readouterr().out
    assert rc == 0
    assert "== v1 ==" in text and "max tokens 1024" in text  # 32 blocks x 32 tokens


def test_plan_subprocess_mistral_json():
    proc = subprocess.run([sys.executable, "-m", "kvcm.cli", "plan", "--model", "mistral-7b-v0.1", "--json"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    by_version = {m["version"]: m for m in out["managers"]}
    assert sorted(by_version) == ["v1", "v2"]
    for m in by_version.values():
        # Mistral-7B: 131072 bytes a token, one window-4096 group (every layer slides); budget 0.9 x 80 GiB = 72 GiB;
        # 72 GiB / 4 MiB = 72 x 256 = 18432 blocks
        (group,) = m["final"]["groups"]
        assert (group["window"], group["layers"], group["num_blocks"], group["bytes_per_block"]) == (
            4096, 32, 18432, 4194304)
        assert m["final"]["pool_bytes"] == 18432 * 4194304 == 72 * GiB
    assert by_version["v1"]["final"]["constraints"] == []
    assert by_version["v2"]["final"]["constraints"] == [
        {"name": "context", "requests": [{"count": 1, "capacity": 8192, "history": 0}]}]
    # V1 keeps every block of a request: 8192 / 32 = 256 -> 18432 // 256 = 72.
    # V2 releases stale window blocks: at history 8191, (8192 - 4096) // 32 = 128 stale -> 128 held -> 144.
    assert by_version["v1"]["max_concurrency"] == 72
    assert by_version["v2"]["max_concurrency"] == 144
