"""No cost grows with a number the user types: a value beyond what anything can use is refused at once, and an
accepted one costs what a small one costs.

Before: a pool allocated one in-use flag per page up front, so a budget of
10^14 small pages was a ``MemoryError``; a config of millions of layers planned for minutes; a simulated machine
of 10^9 GPUs stalled start-up.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import kvcm
import kvcm.cli
from kvcm.block_pool import BlockPool
from kvcm.config import KvCacheConfig
from kvcm.model_spec import ModelSpec
from kvcm.versions import NAMES as ALL_VERSIONS

ROOT = Path(__file__).resolve().parents[2]


def test_a_pool_of_1e14_pages_builds_at_once_and_works():
    pool = BlockPool(10**14, 2)
    first = pool.allocate(3)
    assert pool.num_free == 10**14 - 3 and all(pool.is_used(b) for b in first) and not pool.is_used(10**13)
    pool.release(first)
    assert pool.num_free == 10**14
    with pytest.raises(RuntimeError, match="released twice"):
        pool.release([10**13])


@pytest.mark.parametrize("kind", ALL_VERSIONS)
def test_a_huge_token_budget_builds_a_manager(kind):
    mgr = kvcm.create_kv_cache_manager(kind, ModelSpec.uniform(1, 1, 1), KvCacheConfig(max_tokens=10**15),
                                       max_batch_size=2, max_seq_len=64, device="meta")
    assert mgr.get_num_free_blocks() == 10**15 // 32
    assert mgr.add_dummy_requests([0, 1], token_nums=[64, 64]) is not None


LAYERS = [
    ("uniform", lambda: ModelSpec.uniform(2000, 1, 16), "num_layers=2000 is invalid: must be >= 1 and <= 1024"),
    ("hf_config", lambda: ModelSpec.from_hf_config({"num_hidden_layers": 2000, "num_attention_heads": 4,
                                                    "hidden_size": 64}), "num_hidden_layers=2000 is invalid"),
    ("deepseek_ratios", lambda: kvcm.DeepseekV4Spec(compress_ratios=(4,) * 2000), "compress_ratios"),
    ("deepseek_mtp", lambda: kvcm.DeepseekV4Spec().to_model_spec(2000),
     "max_draft_len=2000 is invalid: caches D - 1 MTP layers beside the model's 43, at most 1024"),
]


@pytest.mark.parametrize("make, fragment", [c[1:] for c in LAYERS], ids=[c[0] for c in LAYERS])
def test_more_layers_than_max_layers_is_a_config_error(make, fragment):
    with pytest.raises(kvcm.ConfigError) as exc:
        make()
    assert fragment in str(exc.value)


@pytest.mark.parametrize("count", ["1000000000", "true"], ids=["1e9", "bool"])
def test_simulated_machine_gpu_count_is_bounded(tmp_path, count):
    (tmp_path / "test_ok.py").write_text("def test_ok():\n    pass\n")
    env = {**os.environ, "PYTHONPATH": f"{ROOT}:{os.environ.get('PYTHONPATH', '')}"}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "pytest_kvcm.plugin", "-p", "no:cacheprovider",
                           "-p", "no:randomly", "-q", "test_ok.py", f"--kvcm-machine={{\"gpu_count\": {count}}}"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == pytest.ExitCode.USAGE_ERROR, proc.stdout + proc.stderr
    assert f"gpu_count={json.loads(count)!r} must be an integer in [0, 1024]" in proc.stdout + proc.stderr


@pytest.mark.post_merge
def test_a_sequence_past_max_seq_len_is_refused_at_once(tmp_path, capsys):
    """A config claiming 10^15 positions planned with ``-S 10^15`` (and a 10^15-token pool) walked its long
    warmup dummy block by block for two minutes; ``kvcm.MAX_SEQ_LEN`` (2^24) refuses it, and the largest
    accepted length plans in seconds."""
    cfg = json.loads((ROOT / "kvcm" / "configs" / "qwen3-0.6b.json").read_text())
    cfg["max_position_embeddings"] = 10**15
    path = tmp_path / "huge.json"
    path.write_text(json.dumps(cfg))
    assert kvcm.cli.main(["plan", "--model", str(path), "-S", str(10**15), "--max-tokens", str(10**15)]) == 2
    err = capsys.readouterr().err
    assert "-S/--max-seq-len=1000000000000000 is invalid" in err and "kvcm.MAX_SEQ_LEN" in err
    assert err.count("\n") == 1
    with pytest.raises(kvcm.ConfigError, match="kvcm.MAX_SEQ_LEN"):
        kvcm.Limits(8, 10**15)
    start = time.monotonic()
    assert kvcm.cli.main(["plan", "--model", str(path), "-S", str(kvcm.MAX_SEQ_LEN), "-B", "65536",
                          "--max-tokens", str(10**15), "--json"]) == 0
    assert time.monotonic() - start < 300   # seconds idle; a minute with both cores busy; a hang is hours
