"""How many 4,096-token Gemma 3 270M requests a 1 GiB KV pool holds at once, V1 beside V2, in one run.

    python benchmarks/gemma3_concurrency.py [--seq-len 4096] [--gib 1] [--device meta|cpu]

Each manager is built as the engine builds it (B=256, S=8192, N=8192, tpb 32, bf16) on the same budget; then
requests are admitted one by one, each prefilled with ``seq_len - 1`` tokens and started on its decode step
(capacity ``seq_len``, the in-flight token's page held), until the pools refuse one. V2's sliding pool keeps
only the window's pages of each request (17 of 128), so the full-attention pool binds, and it got the bytes V1
spends on the sliding layers' out-of-window pages.
"""
from __future__ import annotations

import argparse

import kvcm
from kvcm.config import KvCacheConfig
from kvcm.errors import OutOfPagesError
from kvcm.versions import NAMES as ALL_VERSIONS


def concurrent(version: str, seq_len: int, gib: float, device: str) -> tuple[int, list[int], int]:
    cfg = KvCacheConfig(max_gpu_total_bytes=int(gib * 2**30), tokens_per_block=32)
    mgr = kvcm.create_kv_cache_manager(version, kvcm.load_spec("gemma-3-270m"), cfg, max_batch_size=256,
                                       max_seq_len=8192, max_num_tokens=8192, device=device)
    n, prompt = 0, seq_len - 1
    while True:
        try:  # the engine's calls: the whole prompt as one chunk, then its first decode step
            mgr.begin_context_chunk(n, 0, prompt, prompt)
            mgr.end_context_chunk(n, prompt)
            mgr.begin_generation(n)
        except OutOfPagesError:
            break
        n += 1
    return n, [g.num_blocks for g in mgr.layer_groups], mgr.pool_bytes


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seq-len", type=int, default=4096)
    ap.add_argument("--gib", type=float, default=1.0)
    ap.add_argument("--device", default="meta")
    args = ap.parse_args()
    res = {v: concurrent(v, args.seq_len, args.gib, args.device) for v in ALL_VERSIONS}
    for v, (n, blocks, nbytes) in res.items():
        print(f"{v}: {n} requests of {args.seq_len:,} tokens at once; pools {blocks} blocks "
              f"(sliding, full), {nbytes / 2**20:,.1f} MiB")
    print(f"v2 / v1 = {res['v2'][0] / max(res['v1'][0], 1):.2f}x")


if __name__ == "__main__":
    main()
