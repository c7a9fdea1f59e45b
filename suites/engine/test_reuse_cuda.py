"""Block reuse on the GPU lane: SmolLM2-135M in fp32 on the Triton kernels and CUDA graphs, V1 and V2.

The CPU lane's gates (``test_reuse_parity.py``, ``test_reuse_gsm8k.py``) run the torch attention path. Here the
prefill of a reused request runs where the field runs it: the Triton kernel reads the cached prefix through the
block table while a token-bucket graph computes only the tail, and decode steps replay captured graphs. Each gate
is a second ``generate`` on one engine (the first fills the cache), asserts that reuse happened, and compares:

* reuse on == reuse off, token for token (the field's reuse bugs: vLLM #5543 / #7845 inconsistent greedy
  completions with prefix caching, TensorRT-LLM #8813 tokens from other prompts, #15503 logits that change on
  repeat);
* reuse on == Hugging Face ``generate`` (an uncached model), where a difference may only be a near tie
  (margin < 1e-3: the Triton kernel sums in another order than HF's attention).

The first ``generate`` runs *other* prompts sharing the prefixes (but for the same-prompt case), so the compared
run's hits end part way through each prompt, where an engine that starts its prefill at the wrong token or trusts
a hit for the whole prompt reads KV it never wrote (``reuse-prefill-skips-a-token``,
``reuse-prefill-trusts-any-hit``).

Cases: (a) the same prompt twice, (b) prompts sharing a prefix and diverging at and around block boundaries,
(c) GSM8K 8-shot (one shared prefix from the train split, then each test question), (d) reuse after preemption,
(e) speculative decoding (the n-gram pool, and a draft model with its own reusing cache).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from kvcm import KvCacheConfig
from kvcm.engine import LLM, SamplingParams
from kvcm.engine.llm import eos_token_ids
from kvcm.models import chat_prompt_ids, hf_generate, truncated_drafter
from pytest_kvcm.models import require_smollm2
from pytest_kvcm.parity import compare_outputs
from kvcm.versions import NAMES as ALL_VERSIONS

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "accuracy"))
from _real_gsm8k import REAL  # noqa: E402

pytestmark = [pytest.mark.gpu(count=1), pytest.mark.post_merge]   # the GPU lane's models stage: the weights staged
TPB = 16
NEW = 32
VERSIONS = pytest.mark.parametrize("version", ALL_VERSIONS)
TEXT = ("Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. How many "
        "clips did Natalia sell altogether in April and May? Weng earns $12 an hour for babysitting. Yesterday, "
        "she just did 50 minutes of babysitting. How much did she earn? Betty is saving money for a new wallet "
        "which costs $100. Betty has only half of the money she needs. Her parents decided to give her $15 for "
        "that purpose, and her grandparents twice as much as her parents. How much more money does Betty need?")


@pytest.fixture(scope="module")
def smollm2_cuda():
    return require_smollm2(dtype=torch.float32, device="cuda")


def engine(model, tok, version, reuse, *, max_tokens=32768, **kw):
    return LLM(model, tok, kvcm_version=version, max_batch_size=kw.pop("max_batch_size", 8), max_seq_len=2048,
               device="cuda", cuda_graph=True, enable_block_reuse=reuse, **kw,
               kv_cache_config=KvCacheConfig(max_tokens=max_tokens, tokens_per_block=TPB, dtype="float32"))


def second_run(model, tok, version, reuse, prompts, *, warm=None, params=None, **kw):
    """``warm`` (default: ``prompts``), then ``prompts`` on one engine: the second call's outputs and the engine."""
    llm = engine(model, tok, version, reuse, **kw)
    params = params or SamplingParams(max_new_tokens=NEW)
    llm.generate(warm if warm is not None else prompts, params)
    outs = llm.generate(prompts, params)
    assert llm.graphs.num_replays > 0, "no step replayed a graph"
    if reuse:
        st = llm.reuse_stats
        assert st.reused_tokens > 0 and st.computed_tokens < st.prompt_tokens, f"no reuse happened: {st}"
    return outs, llm


def gate(smollm2_cuda, version, prompts, greedy_parity, *, warm=None, **kw):
    """Reuse on == reuse off exactly, and == HF up to near ties; returns the reuse-on engine."""
    model, tok = smollm2_cuda
    on, llm = second_run(model, tok, version, True, prompts, warm=warm, **kw)
    off, off_llm = second_run(model, tok, version, False, prompts, warm=warm, **kw)
    off_llm.close()
    greedy_parity.check(compare_outputs(off, on, prompts, names=("reuse off", "reuse on"), tokenizer=tok),
                        model="smollm2-135m")
    ref = hf_generate(model, prompts, NEW, eos_token_id=list(eos_token_ids(model, tok)), batch_size=1)
    greedy_parity.check(compare_outputs(ref, on, prompts, names=("hf", "reuse on"), tokenizer=tok,
                                        margin_tolerance=1e-3), model="smollm2-135m")
    return llm


@VERSIONS
def test_same_prompt_twice(smollm2_cuda, version, greedy_parity):
    _, tok = smollm2_cuda
    p = chat_prompt_ids(tok, TEXT)
    llm = gate(smollm2_cuda, version, [p, p], greedy_parity)
    assert llm.reuse_stats.token_hit_rate > 0.9, str(llm.reuse_stats)


@VERSIONS
def test_shared_prefixes_diverging_at_block_boundaries(smollm2_cuda, version, greedy_parity):
    _, tok = smollm2_cuda
    base = tok(TEXT)["input_ids"]
    tails = [tok(f" Question {i}: what is {i} times {i + 3}?")["input_ids"] for i in range(8)]
    cuts = (TPB - 1, TPB, TPB + 1, 3 * TPB - 1, 3 * TPB, 3 * TPB + 1, 5 * TPB)
    prompts = [base[:c] + t for c, t in zip(cuts, tails)] + [base[:4 * TPB]]
    warm = [base[:c] + tails[(i + 3) % len(tails)] for i, c in enumerate(cuts)]    # the same prefixes, other tails
    gate(smollm2_cuda, version, prompts, greedy_parity, warm=warm)


@VERSIONS
@pytest.mark.skipif(not (REAL / "train.jsonl").is_file(), reason=f"real GSM8K not present at {REAL}")
def test_gsm8k_8shot(smollm2_cuda, version, greedy_parity):
    from pytest_kvcm.accuracy import load_gsm8k
    from pytest_kvcm.accuracy.gsm8k import build_prompt

    _, tok = smollm2_cuda
    data = load_gsm8k(REAL)
    shots = [data.train[i] for i in range(8)]
    prompts = [tok(build_prompt(data.test[i]["question"], shots))["input_ids"] for i in range(8)]
    llm = gate(smollm2_cuda, version, prompts, greedy_parity, warm=prompts[:1], max_num_tokens=1024)
    st = llm.reuse_stats
    assert st.computed_tokens < 0.15 * st.prompt_tokens, f"the shared 8-shot prefix was not reused: {st}"


@VERSIONS
def test_reuse_after_preemption(smollm2_cuda, version, greedy_parity):
    """A pool of 24 blocks cannot hold eight requests of ~80 tokens growing by 32 (about 28 blocks with the
    shared 4): preempted ones come back and find their own and the shared blocks cached."""
    _, tok = smollm2_cuda
    head = tok(TEXT)["input_ids"][:64]
    prompts = [head + tok(f" Case {i}: add {i} and {7 * i}.")["input_ids"] for i in range(8)]
    llm = gate(smollm2_cuda, version, prompts, greedy_parity, warm=prompts[:1], max_tokens=24 * TPB)
    assert llm.num_preemptions > 0, "the pool was meant to force preemption"


@VERSIONS
@pytest.mark.parametrize("drafter", ["ngram", "model"])
def test_speculative_with_reuse(smollm2_cuda, version, drafter, greedy_parity):
    model, tok = smollm2_cuda
    base = tok(TEXT)["input_ids"]
    prompts = [base[:40 + 7 * i] + tok(f" So the answer to part {i} is")["input_ids"] for i in range(6)]
    warm = [base[:40 + 7 * i] + tok(" Meanwhile")["input_ids"] for i in range(6)]
    d = "ngram" if drafter == "ngram" else truncated_drafter(model, 6)
    llm = gate(smollm2_cuda, version, prompts, greedy_parity, warm=warm, drafter=d, max_draft_len=4,
               spec_max_concurrency=None, spec_acceptance_window=0)
    assert llm.spec_stats.steps > 0
    if drafter == "model":
        assert llm.drafter.reuse and llm.drafter.manager.get_kv_cache_stats().reused_blocks > 0
