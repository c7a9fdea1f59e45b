"""The attention kernel's test steps and their written-out reference, shared by the kernel tests."""
from __future__ import annotations

import torch


def reference(q, kv, block_table, seq_lens, query_start, scale, window, tpb, chunk=None):
    """Softmax attention per query row, written out: the keys a query may read and nothing else (a chunk: those
    of the query's own chunk, ``k // chunk == q // chunk``)."""
    heads, rep = q.shape[1], q.shape[1] // kv.shape[3]
    out = torch.zeros(q.shape, dtype=torch.float64)
    for s in range(block_table.shape[0]):
        a, b, kv_len = int(query_start[s]), int(query_start[s + 1]), int(seq_lens[s])
        for i in range(a, b):
            qpos = kv_len - (b - a) + (i - a)
            keys = [p for p in range(max(0, qpos - window + 1) if window else 0, qpos + 1)
                    if block_table[s, p // tpb] >= 0 and (chunk is None or p // chunk == qpos // chunk)]
            if not keys:
                continue
            k = torch.stack([kv[block_table[s, p // tpb], 0, p % tpb] for p in keys]).double()
            v = torch.stack([kv[block_table[s, p // tpb], 1, p % tpb] for p in keys]).double()
            for h in range(heads):
                w = torch.softmax(k[:, h // rep] @ q[i, h].double() * scale, 0)
                out[i, h] = w @ v[:, h // rep]
    return out


def case(heads, kv_heads, dim, tpb, window, chunk=None, rows=None):
    """A decode, a speculative verification (5 queries), prefill chunks at 0 and past it, a padding row of KV
    length 0 (or ``rows``, (queries, KV length) each); released pages (-1) and every page no row holds filled
    with NaN. Returns the kernel's arguments (q, kv, table, seq_lens, query_start, scale) and the reference output."""
    g = torch.Generator().manual_seed(heads * tpb)
    rows = rows or [(1, 37), (5, 21), (13, 13), (7, 50), (1, 3), (9, 0)]
    num_blocks, width = 40, 8
    kv = torch.full((num_blocks, 2, tpb, kv_heads, dim), float("nan"))
    table = torch.full((len(rows), width), -1, dtype=torch.long)
    free = torch.randperm(num_blocks, generator=g).tolist()
    for s, (_, kv_len) in enumerate(rows):
        for j in range(-(-kv_len // tpb)):
            table[s, j] = b = free.pop()
            kv[b] = torch.randn(2, tpb, kv_heads, dim, generator=g)
    if window or chunk:
        kv[table[3, 0]] = float("nan")       # released by the window or the chunk: never read
        table[3, 0] = -1
    lens = torch.tensor([n for _, n in rows])
    starts = torch.tensor([0] + [q for q, _ in rows]).cumsum(0)
    q = torch.randn(heads, int(starts[-1]), dim, generator=g).transpose(0, 1)    # strided, as the model gives it
    scale = dim ** -0.5
    return (q, kv, table, lens, starts, scale), reference(q, kv, table, lens, starts, scale, window, tpb, chunk)
