"""GSM8K few-shot with block reuse: one shared 8-shot prefix from the train split, then each test question.

Every prompt carries the same prefix, the textbook case for reuse (lm-eval and TensorRT-LLM's accuracy tests run
GSM8K few-shot). Reuse on must give exactly the completions of reuse off, and Hugging Face's, in fp32:

* a tiny seeded model on the prompts' bytes (fast, the CPU lane's gate);
* SmolLM2-135M on the real text (slow: minutes on a 2-core CPU), and the accuracy gate with reuse on.
"""

import sys
from pathlib import Path

import pytest
import torch

import kvcm
from kvcm.engine import LLM, SamplingParams
from kvcm.models import hf_generate, tiny_model
from pytest_kvcm.accuracy import (AccuracyGate, ReferenceError, evaluate_gsm8k, kvcm_generate_fn, load_gsm8k,
                                  lookup_reference)
from pytest_kvcm.accuracy.gsm8k import build_prompt
from kvcm.versions import NAMES as ALL_VERSIONS

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "suites" / "accuracy"))
from _real_gsm8k import REAL  # noqa: E402

SHOTS = 8
QUESTIONS = 4

pytestmark = pytest.mark.skipif(not (REAL / "train.jsonl").is_file(), reason=f"real GSM8K not present at {REAL}")


def fewshot_prompts(n=QUESTIONS):
    """The shared 8-shot prefix (the first train rows, fixed order) before each of the first ``n`` questions."""
    data = load_gsm8k(REAL)
    shots = [data.train[i] for i in range(SHOTS)]
    return [build_prompt(data.test[i]["question"], shots) for i in range(n)], shots, data


def engine(model, tok, version, reuse, **kw):
    return LLM(model, tok, kvcm_version=version, max_batch_size=kw.pop("max_batch_size", 4),
               max_seq_len=kw.pop("max_seq_len", 4096), enable_block_reuse=reuse, **kw,
               kv_cache_config=kvcm.KvCacheConfig(tokens_per_block=16, max_tokens=kw.pop("max_tokens", 32768),
                                                  dtype="float32"))


@pytest.mark.parametrize("version", ALL_VERSIONS)
def test_fewshot_parity_tiny(version):
    """Tiny llama on the prompts' bytes (ids 3..255), cut to 1,500 tokens of shared prefix: on == off == HF."""
    model, _ = tiny_model("llama")
    texts, _, _ = fewshot_prompts()
    prompts = [[3 + b % 253 for b in t.encode()] for t in texts]
    common = 0
    while all(p[common] == prompts[0][common] for p in prompts):
        common += 1
    keep = max(0, common - 1500)
    prompts = [p[keep:] for p in prompts]
    params = SamplingParams(max_new_tokens=12, ignore_eos=True)
    outs = {}
    for reuse in (False, True):
        llm = engine(model, None, version, reuse, max_batch_size=2)
        outs[reuse] = [o.token_ids for o in llm.generate(prompts, params)]
        if reuse:
            st = llm.reuse_stats
            assert st.reused_tokens >= (len(prompts) - 2) * 1400, st
    assert outs[True] == outs[False]
    ref = [o.token_ids for o in hf_generate(model, prompts, 12)]
    assert [o[:len(r)] for o, r in zip(outs[True], ref)] == ref


@pytest.fixture(scope="module")
def smollm2():
    from pytest_kvcm.models import require_smollm2

    return require_smollm2(dtype=torch.float32)


@pytest.mark.slow
@pytest.mark.parametrize("version", ALL_VERSIONS)
def test_fewshot_parity_smollm2(smollm2, version):
    model, tok = smollm2
    texts, _, _ = fewshot_prompts()
    prompts = [tok(t)["input_ids"] for t in texts]
    shared = 0
    while all(p[shared] == prompts[0][shared] for p in prompts):
        shared += 1
    params = SamplingParams(max_new_tokens=24)
    outs = {}
    for reuse in (False, True):
        llm = engine(model, tok, version, reuse, max_num_tokens=512)
        outs[reuse] = [o.token_ids for o in llm.generate(prompts, params)]
        if reuse:
            # 512-token chunks: the second request is admitted while the first still prefills, before V1 stores
            # anything (at context end; V2 commits each chunk), so at least the last two find the whole prefix
            assert llm.reuse_stats.reused_tokens >= 2 * (shared - shared % 16), (shared, llm.reuse_stats)
    assert outs[True] == outs[False]
    from kvcm.engine.llm import eos_token_ids
    ref = [o.token_ids for o in hf_generate(model, prompts, 24, eos_token_id=list(eos_token_ids(model, tok)),
                                            batch_size=1)]
    assert outs[True] == ref


@pytest.mark.slow
@pytest.mark.accuracy
def test_fewshot_accuracy_gate_with_reuse(smollm2, kvcm_results):
    """The shared-prefix 8-shot prompt, reuse on, scored and gated as ``suites/accuracy`` gates SmolLM2 (smoke
    size; measure mode while ``gsm8k.yaml`` has no entry); reuse off must give the same completions."""
    model, tok = smollm2
    _, shots, data = fewshot_prompts()
    prefix = build_prompt("", shots).rsplit("\n\n", 1)[0] + "\n\n"
    results = {}
    for reuse in (False, True):
        fn = kvcm_generate_fn(engine(model, tok, "v2", reuse, max_num_tokens=1024), tok)

        def shared(prompts, max_new_tokens=96, stop=("Question:",), fn=fn):
            return fn([prefix + p for p in prompts], max_new_tokens=max_new_tokens, stop=stop)
        results[reuse] = evaluate_gsm8k(shared, data.test,
                                        num_fewshot=0, limit=QUESTIONS, batch_size=QUESTIONS, max_new_tokens=96)
    assert [s.completion for s in results[True].samples] == [s.completion for s in results[False].samples]
    spec = {"dtype": "float32", "quant_algo": "Q4_1"}
    model_name = "HuggingFaceTB/SmolLM2-135M-Instruct"
    try:
        lookup_reference("gsm8k", model_name, spec, reference_dir=ROOT / "ci" / "references")
        mode = "smoke"
    except ReferenceError:
        mode = "measure"
    r = results[True]
    AccuracyGate(mode, reference_dir=ROOT / "ci" / "references", record=kvcm_results.record)(
        "gsm8k", model=model_name, spec=spec, score=r.score, num_samples=r.num_samples, kvcm_version="v2",
        extra={"strict": r.strict, "flexible": r.flexible, "fewshot": "shared 8-shot", "reuse": True})
