"""Gemma 3 270M on CUDA: the GPU lane's sliding-window gates, on the Triton kernels and CUDA graphs, in fp32.

The CPU lane (``test_gemma3_parity.py``) proves V1 = V2 = HF on the torch attention path. Here the same model
runs where the field runs it: paged attention in the Triton kernel (which must honour the 512-token window on
every sliding layer) and decode steps replayed from captured graphs (whose block tables V2 rewrites as pages leave
the window). Gates: V1 = V2 = Hugging Face ``generate`` token for token, V1 and V2 logit margins equal, V2
releasing sliding pages that V1 keeps, and a second request that reuses a cached prefix longer than the window
giving the tokens of a run with reuse off.
"""

from __future__ import annotations

import pytest

from kvcm import KvCacheConfig
from kvcm.engine import LLM, SamplingParams
from kvcm.engine.llm import eos_token_ids
from kvcm.models import hf_generate
from pytest_kvcm.models import require_gemma3
from pytest_kvcm.parity import compare_outputs

from test_gemma3_parity import WINDOW, fewshot_ids
from kvcm.versions import NAMES as ALL_VERSIONS

pytestmark = [pytest.mark.gpu(count=1), pytest.mark.post_merge]   # the GPU lane's models stage: the weights staged
TPB = 16


@pytest.fixture(scope="module")
def gemma3_cuda():
    return require_gemma3(device="cuda")


def _engine(model, tok, version, *, reuse=False, **kw):
    return LLM(model, tok, kvcm_version=version, max_batch_size=8, max_seq_len=2560, device="cuda",
               cuda_graph=True, enable_block_reuse=reuse, max_num_tokens=kw.pop("max_num_tokens", None),
               kv_cache_config=KvCacheConfig(max_tokens=16384, tokens_per_block=TPB, dtype="float32"))


def test_v1_v2_hf_on_graphs_past_the_window(gemma3_cuda, greedy_parity):
    """Prompts of 300, 600 and 2,000 tokens (one chunked across the window edge): V1 = V2 = HF on CUDA graphs."""
    model, tok = gemma3_cuda
    prompts = [fewshot_ids(tok, 300, 1), fewshot_ids(tok, 600, 2), fewshot_ids(tok, 2000, 3)]
    ref = hf_generate(model, prompts, max_new_tokens=48, eos_token_id=list(eos_token_ids(model, tok)), batch_size=1)
    outs, usage = {}, {}
    for version in ALL_VERSIONS:
        llm = _engine(model, tok, version, max_num_tokens=400)
        assert llm.graphs is not None and llm.graphs.shapes, "no CUDA graph captured"
        outs[version] = llm.generate(prompts, SamplingParams(max_new_tokens=48))
        assert llm.graphs.num_replays > 0
        usage[version] = llm.page_usage
        llm.close()
    greedy_parity.check(compare_outputs(outs["v1"], outs["v2"], prompts, names=("v1", "v2"), tokenizer=tok),
                        model="gemma-3-270m")
    greedy_parity.check(compare_outputs(ref, outs["v2"], prompts, names=("hf", "v2"), tokenizer=tok,
                                        margin_tolerance=1e-3), model="gemma-3-270m")
    for a, b in zip(outs["v1"], outs["v2"]):
        drift = max((abs(x - y) for x, y in zip(a.logits_margins, b.logits_margins)), default=0.0)
        assert drift <= 1e-4, f"V1 and V2 margins differ by {drift:.2e}: V2's sliding pages held other keys"
    sliding = {v: next(g for g in usage[v] if g.window == WINDOW) for v in usage}
    assert sliding["v1"].released_stale == 0
    assert sliding["v2"].released_stale > 0, str(sliding["v2"])


@pytest.mark.parametrize("version", ALL_VERSIONS)
def test_reuse_of_a_prefix_longer_than_the_window_on_graphs(gemma3_cuda, version):
    """A second request sharing a 700-token prefix with the first: reuse on gives the tokens of reuse off."""
    model, tok = gemma3_cuda
    first = fewshot_ids(tok, 760, 4)
    second = first[:700] + fewshot_ids(tok, 80, 5)[1:]
    params = SamplingParams(max_new_tokens=32)
    runs = {}
    for reuse in (False, True):
        llm = _engine(model, tok, version, reuse=reuse)
        runs[reuse] = [llm.generate([first], params)[0].token_ids, llm.generate([second], params)[0].token_ids]
        if reuse:   # V1 the whole prefix; V2 what its sliding group holds in window (docs/semantics.md 11.2)
            print(version, llm.reuse_stats)
            assert llm.reuse_stats.reused_tokens > 0, str(llm.reuse_stats)
        llm.close()
    assert runs[True] == runs[False]
