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
    ("draft_with_pp", ["--draft-model", "qwen3-0.6b", "--pp", "2"],
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
