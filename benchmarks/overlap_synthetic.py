"""The overlapped step loop on a SmolLM2-135M-shaped model with random weights: no weights to stage, so it runs
on any CUDA machine. Same shapes as the real model (30 layers, hidden 576, GQA 9/3 heads, vocab 49,152, bf16),
so step times and tokens/s are the real model's; the tokens themselves mean nothing (every request runs its
full length, EOS ignored).

Prints the graph decode step at batch 256 (GPU time, period overlapped and not, host share, host work a step:
``step_profile.py``), then kvcm with CUDA graphs, serial and overlapped, and HF ``generate`` on the same 512
prompts of 80..220 random tokens, 200 new tokens each.

    python benchmarks/overlap_synthetic.py
"""
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(1, str(Path(__file__).resolve().parent))


def main() -> int:
    import kvcm
    from kvcm.engine import LLM, SamplingParams
    from kvcm.models import hf_generate
    from step_profile import describe, step_profile
    from throughput import start_cold
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                      num_key_value_heads=3, vocab_size=49152, rope_theta=100000.0, tie_word_embeddings=True,
                      max_position_embeddings=8192, rms_norm_eps=1e-5)
    model = LlamaForCausalLM(cfg).to(torch.bfloat16).cuda().eval()
    t = time.time()
    llm = LLM(model, kvcm_version="v2", kv_cache_config=kvcm.KvCacheConfig(
        tokens_per_block=32, free_gpu_memory_fraction=0.5, dtype="bfloat16"), max_batch_size=256, max_seq_len=480,
        max_num_tokens=8192, device="cuda", cuda_graph=True)
    print(f"setup {time.time() - t:.1f}s, {len(llm.graphs.shapes)} decode shapes, buckets {sorted(llm.graphs.buckets)}")
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, 49000, (int(n),), generator=g).tolist()
               for n in torch.randint(80, 220, (256,), generator=g)]
    print(describe(step_profile(llm, prompts, n=80)), flush=True)
    work, rates = prompts * 2, {}
    for overlap in (False, True):
        llm.pipeline.overlap = overlap
        start_cold(llm)      # the second mode must not find the first's prompts cached
        torch.cuda.synchronize()
        t = time.perf_counter()
        outs = llm.generate(work, SamplingParams(max_new_tokens=200, ignore_eos=True))
        torch.cuda.synchronize()
        n, dt = sum(len(o.token_ids) for o in outs), time.perf_counter() - t
        rates[overlap] = n / dt
        print(f"kvcm graphs, {'overlapped' if overlap else 'serial'}: {n} tokens in {dt:.2f} s = {n / dt:.0f} tok/s",
              flush=True)
    torch.cuda.synchronize()
    t = time.perf_counter()
    hf = hf_generate(model, work, 200, eos_token_id=[cfg.vocab_size - 1], pad_token_id=0, batch_size=256,
                     margins=False)
    torch.cuda.synchronize()
    n, dt = sum(len(o.token_ids) for o in hf), time.perf_counter() - t
    print(f"HF generate: {n} tokens in {dt:.2f} s = {n / dt:.0f} tok/s; kvcm overlapped / HF = "
          f"{rates[True] / (n / dt):.1f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
