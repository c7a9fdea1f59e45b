"""``kvcm plan`` with bad input: exit status 2 and one line naming the option, its value and the limit; no
traceback unless ``--debug`` asks for it. ``-B 100000000`` used to run O(B) for minutes before printing anything,
``--tpb 0`` was read as "unset" and planned with 32, and ``-S`` beyond the model's positions was accepted.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import kvcm.cli

# (case id, arguments after `kvcm plan`, a fragment of the one-line message)
CASES = [
    ("tpb_zero", ["--tpb", "0"], "--tpb=0 is invalid: must be a positive integer and a power of two"),
    ("tpb_not_power_of_two", ["--tpb", "48"], "--tpb=48 is invalid: must be a positive integer and a power of two"),
    ("seq_len_past_positions", ["-S", "100000"], "-S/--max-seq-len=100000 is invalid: must be >= 1 and <= 40960 "
                                                 "(the model's max_position_embeddings)"),
    ("seq_len_zero", ["-S", "0"], "-S/--max-seq-len=0 is invalid"),
    ("batch_zero", ["-B", "0"], "-B/--max-batch-size=0 is invalid: must be >= 1"),
    ("batch_absurd", ["-B", "100000000"], "-B/--max-batch-size=100000000 is invalid: must be >= 1 and <= 65536"),
    ("num_tokens_zero", ["-N", "0"], "-N/--max-num-tokens=0 is invalid: must be >= 1"),
    ("draft_negative", ["-D", "-1"], "-D/--max-draft-len=-1 is invalid: must be >= 0"),
    ("extra_negative", ["-E", "-2"], "-E/--extra-kv-tokens=-2 is invalid: must be >= 0"),
    ("fraction_zero", ["--fraction", "0"], "--fraction=0.0 is invalid: must be in (0, 1)"),
    ("fraction_nan", ["--fraction", "nan"], "--fraction=nan is invalid: must be a finite number"),
    ("free_gib_negative", ["--free-gib", "-1"], "--free-gib=-1.0 is invalid"),
    ("free_gib_inf", ["--free-gib", "inf"], "--free-gib=inf is invalid: must be a finite number"),
    ("max_tokens_zero", ["--max-tokens", "0"], "--max-tokens=0 is invalid: must be >= 1"),
    ("max_gpu_total_gib_zero", ["--max-gpu-total-gib", "0"], "--max-gpu-total-gib=0.0 is invalid"),
    ("dtype_unknown", ["--dtype", "int4"], "--dtype (dtype)='int4' is invalid: one of"),
    ("model_unknown", ["--model", "nope"], "--model 'nope': is neither a file nor an embedded config"),
    ("tp_zero", ["--tp", "0"], "--tp=0 is invalid: must be >= 1"),
    ("pp_negative", ["--pp", "-1"], "--pp=-1 is invalid: must be >= 1"),
    ("tp_not_dividing_heads", ["--tp", "3"], "--tp=3 is invalid: must divide the model's 16 attention heads"),
    ("pp_past_layers", ["--pp", "29"], "--pp=29 is invalid: must be <= the model's 28 layers"),
    ("tp_past_heads_v4", ["--model", "deepseek-v4-flash", "--tp", "128"],
     "--tp=128 is invalid: must divide the model's 64 attention heads"),
    ("draft_with_pp", ["--draft-model", "qwen3-0.6b", "-D", "2", "--pp", "2"],
     "--draft-model='qwen3-0.6b' is invalid: is planned with --tp and --attention-dp, not with --pp"),
    ("v1_on_deepseek", ["--model", "deepseek-v4-flash", "--kvcm-version", "v1"], "DeepSeek-V4 is planned by V2 only"),
]


@pytest.mark.parametrize("args, fragment", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_option_exits_2_with_one_line(capsys, args, fragment):
    assert kvcm.cli.main(["plan", *args]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert fragment in err and err.count("\n") == 1 and "Traceback" not in err


def _config(tmp_path, text: str | bytes):
    path = tmp_path / "config.json"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return str(path)


# (case id, the config file's contents, a fragment of the message)
FILES = [
    ("config_not_json", "{'num_hidden_layers': 2,", "is not valid JSON"),
    ("config_not_utf8", b"\xff\xfe\x00{", "is not UTF-8 text"),
    ("config_a_list", "[1, 2]", "must hold a JSON object, not list"),
    ("config_no_hidden_size", json.dumps({"num_hidden_layers": 2, "num_attention_heads": 4}),
     "hidden_size=None is invalid: is required in the model config"),
    ("config_zero_heads", json.dumps({"num_hidden_layers": 2, "num_attention_heads": 0, "hidden_size": 64}),
     "num_attention_heads=0 is invalid: must be >= 1"),
    ("config_layers_string", json.dumps({"num_hidden_layers": "two", "num_attention_heads": 4, "hidden_size": 64}),
     "num_hidden_layers='two' is invalid: must be an integer"),
]


@pytest.mark.parametrize("text, fragment", [c[1:] for c in FILES], ids=[c[0] for c in FILES])
def test_bad_model_file_exits_2_with_one_line(capsys, tmp_path, text, fragment):
    assert kvcm.cli.main(["plan", "--model", _config(tmp_path, text)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and fragment in err and err.count("\n") == 1


def _run(*args):
    return subprocess.run([sys.executable, "-m", "kvcm.cli", *args], capture_output=True, text=True, timeout=120)


def test_no_traceback_without_debug_and_one_with_it():
    quiet = _run("plan", "--tpb", "0")
    assert quiet.returncode == 2 and quiet.stdout == ""
    assert quiet.stderr == "kvcm plan: --tpb=0 is invalid: must be a positive integer and a power of two\n"
    loud = _run("plan", "--tpb", "0", "--debug")
    assert loud.returncode == 1 and "Traceback (most recent call last)" in loud.stderr
    assert "kvcm.errors.ConfigError: --tpb=0 is invalid" in loud.stderr


# ---- second pass: prefixes, draft models, absurd sizes (each accepted, or a traceback, before) -----------------
# Prefix matching is off: argparse used to read each of these as the longer option it begins (`--tp 8` planned
# blocks of 8 tokens through --tpb).
PREFIXES = [["--max-tok", "5"], ["--free", "3"], ["--frac", "0.5"], ["--kvcm", "v1"], ["--max-gpu", "1"],
            ["--max-b", "4"], ["--max-s", "100"], ["--max-n", "100"], ["--max-d", "1"], ["--extra", "2"],
            ["--draft", "qwen3-0.6b", "-D", "2"], ["--two", "-D", "2"]]


@pytest.mark.parametrize("args", PREFIXES, ids=[a[0] for a in PREFIXES])
def test_a_prefix_is_not_an_option(capsys, args):
    assert kvcm.cli.main(["plan", *args]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith(f"kvcm plan: unrecognized arguments: {args[0]}") and err.count("\n") == 1


# argparse's own errors: one line (it used to print its usage block first)
PARSE_ERRORS = [(["--tpb", "abc"], "argument --tpb: invalid int value: 'abc'"),
                (["--kvcm-version", "v3"], "argument --kvcm-version: invalid choice: 'v3'"),
                (["-B"], "argument -B/--max-batch-size: expected one argument"),
                (["--bogus"], "unrecognized arguments: --bogus")]


@pytest.mark.parametrize("args, fragment", PARSE_ERRORS, ids=[a[0][0] for a in PARSE_ERRORS])
def test_a_parse_error_is_one_line(capsys, args, fragment):
    with pytest.raises(SystemExit) if args != ["--bogus"] else _no_exit() as exc:
        code = kvcm.cli.main(["plan", *args])
    code = exc.value.code if isinstance(exc, pytest.ExceptionInfo) else code
    err = capsys.readouterr().err
    assert code == 2 and fragment in err and err.count("\n") == 1 and "usage:" not in err


class _no_exit:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


DRAFTS = [
    ("draft_unknown", ["--draft-model", "nope", "-D", "2"], "--draft-model 'nope': is neither a file nor"),
    ("draft_deepseek", ["--draft-model", "deepseek-v4-flash", "-D", "2"],
     "--draft-model='deepseek-v4-flash' is invalid: DeepSeek-V4 (deepseek-v4-flash) is not planned with a separate"),
    ("target_deepseek", ["--model", "deepseek-v4-flash", "--draft-model", "qwen3-0.6b", "-D", "2"],
     "DeepSeek-V4 (deepseek-v4-flash) is not planned with a separate draft model"),
    ("draft_without_drafts", ["--draft-model", "qwen3-0.6b"], "--draft-model='qwen3-0.6b' is invalid: needs "
                                                              "-D/--max-draft-len >= 1"),
    ("two_model_without_drafts", ["--two-model"], "--two-model=True is invalid: needs -D/--max-draft-len >= 1"),
    ("draft_positions_below_s", ["--model", "seed-oss-36b", "--draft-model", "llama-3-8b", "-S", "16384", "-D", "3"],
     "-S/--max-seq-len=16384 is invalid: must be <= 8189 with -D 3: the draft model (--draft-model llama-3-8b)"),
    ("draft_positions_below_s_plus_d", ["--model", "llama-3-8b", "--draft-model", "llama-3-8b", "-S", "8192", "-D",
                                        "1"], "must be <= 8191 with -D 1"),
    ("drafts_past_step", ["-D", "8192"], "-D/--max-draft-len=8192 is invalid: must be >= 0 and <= 8191 (-N - 1"),
    ("drafts_past_small_step", ["-D", "64", "-N", "64"], "-D/--max-draft-len=64 is invalid: must be >= 0 and <= 63"),
    ("deepseek_mtp_layers", ["--model", "deepseek-v4-flash", "-D", "5000"],
     "-D/--max-draft-len=5000 is invalid: deepseek-v4-flash caches 43 layers plus D - 1 MTP layers, at most 1024"),
    ("free_gib_1e12", ["--free-gib", "1e12"], "--free-gib=1000000000000.0 is invalid: must be in (0, 1048576.0]"),
    ("free_gib_1e300", ["--free-gib", "1e300"], "--free-gib=1e+300 is invalid: must be in (0, 1048576.0]"),
    ("max_gpu_total_gib_1e12", ["--max-gpu-total-gib", "1e12"], "--max-gpu-total-gib=1000000000000.0 is invalid"),
]


@pytest.mark.parametrize("args, fragment", [c[1:] for c in DRAFTS], ids=[c[0] for c in DRAFTS])
def test_bad_draft_or_size_exits_2_with_one_line(capsys, args, fragment):
    assert kvcm.cli.main(["plan", *args]) == 2
    out, err = capsys.readouterr()
    assert out == "" and fragment in err and err.count("\n") == 1


def _layers(n: int, **more) -> str:
    return json.dumps({"num_hidden_layers": n, "num_attention_heads": 4, "hidden_size": 64, **more})


# configs read before torch loads: a bad draft names --draft-model; millions of layers answer at once
LAYER_FILES = [
    ("draft_config_zero_heads", ["--draft-model", "{cfg}", "-D", "2"],
     json.dumps({"num_hidden_layers": 2, "num_attention_heads": 0, "hidden_size": 64}),
     "--draft-model '{cfg}': num_attention_heads=0 is invalid: must be >= 1"),
    ("model_3m_layers", ["--model", "{cfg}"], _layers(3_000_000),
     "--model '{cfg}': num_hidden_layers=3000000 is invalid: must be <= 1024 (kvcm.MAX_LAYERS"),
    ("model_2000_layers", ["--model", "{cfg}"], _layers(2000), "num_hidden_layers=2000 is invalid: must be <= 1024"),
    ("draft_3m_layers", ["--draft-model", "{cfg}", "-D", "2"], _layers(3_000_000),
     "--draft-model '{cfg}': num_hidden_layers=3000000 is invalid"),
    ("deepseek_2000_layers", ["--model", "{cfg}"],
     json.dumps({"model_type": "deepseek_v4", "compress_ratios": [4] * 2000}), "caches 2000 layers plus D - 1 MTP"),
]


@pytest.mark.parametrize("args, text, fragment", [c[1:] for c in LAYER_FILES], ids=[c[0] for c in LAYER_FILES])
def test_bad_config_answers_at_once_naming_its_option(tmp_path, args, text, fragment):
    """A subprocess with a time limit: a config of millions of layers used to plan for four minutes."""
    cfg = _config(tmp_path, text)
    proc = subprocess.run([sys.executable, "-m", "kvcm.cli", "plan", *[a.format(cfg=cfg) for a in args]],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and proc.stdout == "" and proc.stderr.count("\n") == 1, proc.stderr
    assert fragment.format(cfg=cfg) in proc.stderr


# accepted, and doing what the option says (a traceback or an unknown option before)
def test_huge_token_cap_is_planned_not_a_memory_error(capsys):
    """--max-tokens 1e15 used to allocate one flag a page up front: MemoryError."""
    assert kvcm.cli.main(["plan", "--max-tokens", str(10**15), "--kvcm-version", "v1"]) == 0
    assert "= 1,000,000,000,000,000 tokens" in capsys.readouterr().out  # a token budget alone sizes the pool


@pytest.mark.parametrize("flags, line", [
    ([], "  block reuse on [--no-block-reuse], partial reuse on [--no-partial-reuse]: the pools are sized the same"),
    (["--no-block-reuse"], "  block reuse off [--no-block-reuse]: nothing is cached between requests"),
    (["--no-partial-reuse"], "  block reuse on [--no-block-reuse], partial reuse off (whole blocks only) "
                             "[--no-partial-reuse]"),
], ids=["default", "no_block_reuse", "no_partial_reuse"])
def test_reuse_line_names_the_options_that_switch_it(capsys, flags, line):
    assert kvcm.cli.main(["plan", "-B", "4", "-S", "1024", "-N", "1024", "--kvcm-version", "v2", *flags]) == 0
    assert line in capsys.readouterr().out
