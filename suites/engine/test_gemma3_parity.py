"""Gemma 3 270M through the engine on V1 and V2 against Hugging Face ``generate``, in fp32, past its window.

Five of every six layers slide (window 512), so a prompt longer than 512 tokens makes V2 release pages that V1
keeps; the gates are that V1 = V2 = HF token for token and that V1 and V2 give the same logits margins (the
same keys reach every query, so the same numbers: a page released one token early changes them though the
greedy token often survives). The short cases run in the CPU lane; the 2,000-token and GSM8K ones are slow.
Prompts are few-shot arithmetic questions (the embedded set; real GSM8K where ``../shared/data/gsm8k`` exists).
"""

from __future__ import annotations

import json

import pytest

from kvcm import KvCacheConfig
from kvcm.engine import LLM, SamplingParams
from kvcm.engine.llm import eos_token_ids
from kvcm.models import hf_generate
from pytest_kvcm.models import require_gemma3
from pytest_kvcm.accuracy.arith import DATA_DIR, TRAIN_FILE
from pytest_kvcm.accuracy.gsm8k import build_prompt, fewshot_indices
from pytest_kvcm.parity import compare_outputs

WINDOW = 512
TPB = 8          # small pages: a window edge every 8 tokens, so an early or late release shows within a decode


@pytest.fixture(scope="module")
def gemma3():
    return require_gemma3()


def _rows(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def fewshot_ids(tok, n_tokens: int, question: int = 0, rows: list[dict] | None = None) -> list[int]:
    """A few-shot prompt cut to exactly ``n_tokens`` tokens (the shots repeat when the set is short)."""
    rows = rows or _rows(DATA_DIR / TRAIN_FILE)
    shots = [rows[(question + i) % len(rows)] for i in range(1, 4 * n_tokens // 60 + 2)]
    ids = tok(build_prompt(rows[question]["question"], shots)).input_ids
    assert len(ids) >= n_tokens, (len(ids), n_tokens)
    return ids[-n_tokens:] if ids[0] != tok.bos_token_id else ids[:1] + ids[len(ids) - n_tokens + 1:]


def run_engine(model, tok, version, prompts, *, max_new_tokens, max_tokens=4096, max_num_tokens=None,
               max_batch_size=4, max_seq_len=2560):
    llm = LLM(model, tok, kvcm_version=version, max_batch_size=max_batch_size, max_seq_len=max_seq_len,
              max_num_tokens=max_num_tokens,
              kv_cache_config=KvCacheConfig(max_tokens=max_tokens, tokens_per_block=TPB, dtype="float32"))
    outs = llm.generate(prompts, SamplingParams(max_new_tokens=max_new_tokens))
    return outs, llm.page_usage


def check_parity(model, tok, prompts, greedy_parity, *, max_new_tokens, **kw):
    """V1 = V2 = HF tokens, V1 = V2 margins; returns the per-version page usage and outputs."""
    eos = list(eos_token_ids(model, tok))
    ref = hf_generate(model, prompts, max_new_tokens=max_new_tokens, eos_token_id=eos, batch_size=1)
    runs = {v: run_engine(model, tok, v, prompts, max_new_tokens=max_new_tokens, **kw) for v in ("v1", "v2")}
    (v1, _), (v2, _) = runs["v1"], runs["v2"]
    greedy_parity.check(compare_outputs(v1, v2, prompts, names=("v1", "v2"), tokenizer=tok), model="gemma-3-270m")
    greedy_parity.check(compare_outputs(ref, v2, prompts, names=("hf", "v2"), tokenizer=tok,
                                        margin_tolerance=1e-3), model="gemma-3-270m")
    for i, (a, b) in enumerate(zip(v1, v2)):
        drift = max((abs(x - y) for x, y in zip(a.logits_margins, b.logits_margins)), default=0.0)
        # the same keys in the same order on both: fp32 gives the same margins to rounding (0.0 measured)
        assert drift <= 1e-4, (f"prompt {i} ({len(prompts[i])} tokens): V1 and V2 logit margins differ by "
                               f"{drift:.2e}: V2's sliding pages held other keys than V1's window")
    return runs


def released_by_formula(prompt_len: int, num_out: int) -> int:
    """Pages a finished request gave back in a sliding group: those wholly before the window of its last
    in-flight token (docs/semantics.md 4.1), written out here rather than read from the manager."""
    last_history = prompt_len + num_out - 1
    return max(0, (last_history + 1 - WINDOW) // TPB)


@pytest.mark.post_merge
def test_prompts_inside_and_across_the_window_chunked(gemma3, greedy_parity):
    model, tok = gemma3
    # 120 tokens stay inside the window; 600 cross it, and chunks of 200 put a chunk edge across position 512
    prompts = [fewshot_ids(tok, 120, 1), fewshot_ids(tok, 600, 2)]
    runs = check_parity(model, tok, prompts, greedy_parity, max_new_tokens=12, max_num_tokens=200)
    (_, use1), (v2, use2) = runs["v1"], runs["v2"]
    sliding2, full2 = use2
    assert (sliding2.window, full2.window) == (WINDOW, None)
    assert [u.released_stale for u in use1] == [0, 0]            # V1 keeps every page to the end
    assert full2.released_stale == 0
    assert sliding2.released_stale == sum(released_by_formula(len(p), len(o.token_ids))
                                          for p, o in zip(prompts, v2)) > 0
    assert sliding2.peak_held <= use1[0].peak_held
    assert full2.peak_held == use1[1].peak_held


@pytest.mark.slow
def test_preemption_and_resume_past_the_window(gemma3, greedy_parity):
    model, tok = gemma3
    prompts = [fewshot_ids(tok, 530 + 10 * i, i) for i in range(3)]
    # 137 full-attention pages hold two of the three prompts (67 + 68) and little growth: as they decode, one is
    # preempted, recomputed and resumed past the window (measured: V1 1 preemption, V2 8)
    runs = check_parity(model, tok, prompts, greedy_parity, max_new_tokens=20, max_tokens=1100, max_num_tokens=256,
                        max_seq_len=1024)
    assert sum(o.num_preemptions for o in runs["v1"][0]) > 0
    assert sum(o.num_preemptions for o in runs["v2"][0]) > 0
    assert runs["v2"][1][0].released_stale > 0


@pytest.mark.slow
def test_a_2000_token_prompt(gemma3, greedy_parity):
    model, tok = gemma3
    prompts = [fewshot_ids(tok, 2000, 3)]
    runs = check_parity(model, tok, prompts, greedy_parity, max_new_tokens=32, max_num_tokens=512)
    out = runs["v2"][0][0]
    sliding = runs["v2"][1][0]
    assert sliding.released_stale == released_by_formula(2000, len(out.token_ids)) >= 180
    # what V2 holds there at the end: the window's pages, not the prompt's
    assert sliding.peak_held < runs["v1"][1][0].peak_held


@pytest.mark.slow
def test_gsm8k_fewshot_prompts_cross_the_window(gemma3, greedy_parity, gsm8k_rows):
    model, tok = gemma3
    test, train = gsm8k_rows
    shots = fewshot_indices(len(test), len(train), 5)
    prompts = [tok(build_prompt(test[i]["question"], [train[j] for j in shots[i]])).input_ids for i in range(4)]
    assert all(len(p) > WINDOW for p in prompts), [len(p) for p in prompts]
    runs = check_parity(model, tok, prompts, greedy_parity, max_new_tokens=48, max_num_tokens=512)
    assert runs["v2"][1][0].released_stale > 0


@pytest.fixture(scope="module")
def gsm8k_rows():
    from pytest_kvcm.accuracy.gsm8k import split_file

    from suites.accuracy._real_gsm8k import REAL

    if split_file(REAL, "test") is None:
        pytest.skip(f"real GSM8K is not at {REAL} (set KVCM_GSM8K_DIR)")
    return _rows(REAL / "test.jsonl"), _rows(REAL / "train.jsonl")
