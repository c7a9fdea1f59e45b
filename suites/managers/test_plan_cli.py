"""`kvcm plan` end to end on shipped configs; every number checked against arithmetic written out here."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

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
    assert [m["kvcm_version"] for m in out["managers"]] == ["v1", "v2"]
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


def test_plan_llama3_v2_limits(capsys, tmp_path):
    # Llama-3.1-8B (Llama-3-8B's KV shape with 131072 positions), 131072 bytes a token, 4 MiB a block; free 40 GiB
    # -> budget 36 GiB = 9216 blocks; max tokens 9216 x 32 = 294912; S = 131072 needs 4096 blocks: 9216 // 4096 =
    # 2 requests at once.
    config = json.loads((Path(kvcm.cli.__file__).parent / "configs" / "llama-3-8b.json").read_text())
    config.update(_name_or_path="meta-llama/Llama-3.1-8B", max_position_embeddings=131072)
    (tmp_path / "config.json").write_text(json.dumps(config))
    rc, out = _plan(capsys, "--model", str(tmp_path / "config.json"), "--kvcm-version", "v2", "--free-gib", "40",
                    "-B", "256", "-S", "131072", "-N", "8192", "-E", "2")
    assert rc == 0
    (m,) = out["managers"]
    assert [g["num_blocks"] for g in m["final"]["groups"]] == [9216]
    assert m["final"]["max_tokens"] == 294912
    assert m["max_concurrency"] == 2
    assert [c["name"] for c in m["estimation"]["constraints"]] == ["context"]  # no longest_decode
    assert m["final"]["constraints"][0]["requests"] == [{"count": 1, "capacity": 8194, "history": 0}]  # N + E


def test_plan_max_tokens_and_text_output(capsys):
    # --max-tokens 1000 on V1: 1000 // 32 = 31 whole blocks (TensorRT-LLM floors), the final budget 31 x 4 MiB
    rc = kvcm.cli.main(["plan", "--model", "llama-3-8b", "--kvcm-version", "v1", "--max-tokens", "1000", "-B", "4",
                        "-S", "512", "-N", "512"])
    text = capsys.readouterr().out
    assert rc == 0
    # the verdict comes first, in human units: 31 blocks x 32 tokens, 31 x 4 MiB; 512 / 32 = 16 blocks a request
    assert text.splitlines()[1] == "V1: KV cache 124.0 MiB = 992 tokens at S=512: 1 request at once; warmup fits: 3/3 shapes"
    assert "at most 1,000 tokens [--max-tokens]" in text and "80.0 GiB free device memory [--free-gib]" in text
    assert "== V1 in detail ==" in text


def test_plan_text_explains_constraints_and_concurrency_above_b(capsys):
    rc = kvcm.cli.main(["plan", "--model", "deepseek-v4-flash", "-B", "4", "-S", "1024", "-N", "1024"])
    text = capsys.readouterr().out
    assert rc == 0
    lines = text.splitlines()
    assert lines[1].startswith("V2: KV cache ") and "4 requests at once (B binds; the pools would hold" in lines[1]
    assert lines[2].startswith("note: DeepSeek-V4 is planned by V2 only")  # --kvcm-version both: said, not silent
    # the spec's notation stays, after the words
    assert "1 decode at 1,024 tokens (1,023 cached) + 3 new requests of 1 token   [1x(1024,1023) + 3x(1,0)]" in text
    assert "1 prefill of 1,024 tokens (nothing cached)   [1x(1024,0)]" in text
    assert "more than B=4, and the scheduler never runs more than B at once" in text


def test_plan_v1_on_deepseek_v4_is_an_error_not_v2(capsys):
    assert kvcm.cli.main(["plan", "--model", "deepseek-v4-flash", "--kvcm-version", "v1"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and "--kvcm-version v1: DeepSeek-V4 is planned by V2 only" in err


def test_plan_unknown_model_names_the_choices(capsys):
    assert kvcm.cli.main(["plan", "--model", "nope"]) == 2
    assert re.search(r"--model 'nope': is neither a file nor an embedded config \(.*qwen3-0.6b", capsys.readouterr().err)


@pytest.mark.parametrize("args", [["--help"], ["plan", "--help"], ["plan", "--model", "nope"]])
def test_help_and_bad_arguments_answer_before_torch_loads(args):
    """What keeps `kvcm --help` under a second: torch (seconds to import) is not imported to answer."""
    code = ("import sys\nfrom kvcm.cli import main\ntry:\n    main(sys.argv[1:])\nexcept SystemExit:\n    pass\n"
            "assert 'torch' not in sys.modules, 'torch was imported'\n")
    proc = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr


def test_plan_subprocess_mistral_json():
    proc = subprocess.run([sys.executable, "-m", "kvcm.cli", "plan", "--model", "mistral-7b-v0.1", "--json"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    by_version = {m["kvcm_version"]: m for m in out["managers"]}
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


def test_every_plan_option_states_its_default(capsys):
    with pytest.raises(SystemExit):
        kvcm.cli.main(["plan", "--help"])
    text = capsys.readouterr().out
    entries = {}  # option -> its help, joined across argparse's wrapped lines
    for line in text.split("options:")[1].splitlines():
        if line.startswith("  -"):
            name = line.split()[0].rstrip(",")
            entries[name] = line
        elif entries:
            entries[name] += " " + line.strip()
    entries.pop("-h")
    assert len(entries) >= 15, entries
    missing = [name for name, entry in entries.items() if "(default: " not in entry and "default: " not in entry]
    assert not missing, f"options without a stated default: {missing}"
    assert "``" not in text


def test_plan_says_what_block_reuse_does(capsys, monkeypatch):
    """Reuse is on by default (TensorRT-LLM's KvCacheConfig); the plan says it sizes the same pools either way and
    what changes at run time (docs/semantics.md 11.5), and DeepSeek-V4 applies whole-block reuse only."""
    import dataclasses

    import kvcm.plan

    args = ["--model", "qwen3-0.6b", "-B", "4", "-S", "1024", "-N", "1024"]
    rc, on = _plan(capsys, *args)
    assert rc == 0
    reuse = on["block_reuse"]
    assert (reuse["enable_block_reuse"], reuse["enable_partial_reuse"], reuse["changes_pools"]) == (True, True, False)
    assert any("count them as free" in line for line in reuse["at_run_time"])
    assert kvcm.cli.main(["plan", *args]) == 0
    text = capsys.readouterr().out
    assert "block reuse on [--no-block-reuse], partial reuse on [--no-partial-reuse]: the pools are sized the same" in text
    assert "needs ceil(len / tpb) - reused new blocks" in text

    real = kvcm.plan.cache_config
    monkeypatch.setattr(kvcm.plan, "cache_config",
                        lambda **kw: dataclasses.replace(real(**kw), enable_block_reuse=False))
    rc, off = _plan(capsys, *args)
    assert rc == 0 and off["block_reuse"]["enable_block_reuse"] is False and off["block_reuse"]["at_run_time"] == []
    assert [m["final"] for m in off["managers"]] == [m["final"] for m in on["managers"]]   # the same pools

    rc, v4 = _plan(capsys, "--model", "deepseek-v4-flash", "-B", "4", "-S", "1024", "-N", "1024")
    assert rc == 0 and v4["block_reuse"]["enable_partial_reuse"] is False


@pytest.mark.parametrize("model, expected", [("qwen3-0.6b", 12288), ("gemma-3-270m", 24576)])
def test_plan_json_gives_tensorrt_llms_estimation_tokens(capsys, model, expected):
    """``--json`` carries the ``max_tokens`` TensorRT-LLM's estimation step would give its V2 cache
    (``_get_token_num_for_estimation``): S = N = 8192, B = 256, tpb 32: dummies of 8,191 and 1 tokens (257 blocks)
    against CUDA-graph warmup's ``ceil(8193 / 32) + min(256, 128) - 1 = 384`` blocks: 12,288 tokens, doubled for
    Gemma 3's two pool groups (window 512 and full)."""
    kvcm.cli.main(["plan", "--model", model, "--json"])
    out = json.loads(capsys.readouterr().out)
    v2 = [m for m in out["managers"] if m["kvcm_version"] == "v2"][0]
    assert v2["trtllm_estimation_max_tokens"] == expected


def test_every_lazy_public_name_is_one_static_tools_see():
    """``kvcm``'s public names load on first use (``_EXPORTS``); the ``TYPE_CHECKING`` imports are the same names as
    type checkers and IDEs see them. The two lists are kept by hand: ``TokenRangeRetentionConfig`` was public and
    missing from the second."""
    import ast

    tree = ast.parse(Path(kvcm.__file__).read_text())
    static = next(node for node in tree.body if isinstance(node, ast.If))
    seen = {alias.asname or alias.name for imp in static.body for alias in imp.names}
    assert seen == set(kvcm._EXPORTS) == set(kvcm.__all__)
