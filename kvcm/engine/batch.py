"""A step's packed metadata: the integer tensors one forward reads, built from the scheduled items.

For ``S`` sequence rows, ``T`` tokens, ``W`` block-table columns and ``R`` logit rows (all int64):

* ``input_ids [T]``, ``positions [T]``; ``seq_lens [S]`` (KV length after the step); ``query_start [S + 1]``;
* ``logit_rows [R]``: the packed rows whose logits the step returns;
* per layer group: ``slot_block [T]``, ``slot_offset [T]`` (where each token's K/V goes) and
  ``block_table [S, W]`` (the physical page of each logical block, -1 = none).

One host buffer and one device buffer hold all of it, so a step costs one host-to-device copy. An eager step
sizes the buffers to itself; a CUDA graph keeps buffers of a fixed size and pads, either *row-wise* (a decode
shape: each padding row is a decode of the same query length on the engine's pad pages) or in *bulk* (one
padding row holds every spare token, with KV length 0, so attention does no work for it).

The host side is numpy, filled with vectorised indexing: per step the Python cost is a few operations per
sequence (its block-table rows), not per token.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np
import torch

from ..units import ceil_div


@dataclass
class Filled:
    """What the host keeps of a fill: the leading rows that share one query length (the torch reference
    attends to those in one batch), and how many logit rows are real."""
    num_uniform: int
    uniform_q_len: int
    num_logits: int = 0


class StepBuffers:
    def __init__(self, *, num_tokens: int, num_seqs: int, num_logits: int, width: int, num_groups: int,
                 device: torch.device, pinned: bool = False):
        self.num_tokens, self.num_seqs, self.num_logits, self.width = num_tokens, num_seqs, num_logits, width
        self.device = torch.device(device)
        shapes = [("input_ids", (num_tokens,)), ("positions", (num_tokens,)), ("seq_lens", (num_seqs,)),
                  ("query_start", (num_seqs + 1,)), ("logit_rows", (num_logits,))]
        for g in range(num_groups):
            shapes += [(f"slot_block{g}", (num_tokens,)), (f"slot_offset{g}", (num_tokens,)),
                       (f"block_table{g}", (num_seqs, width))]
        total = sum(int(np.prod(s)) for _, s in shapes)
        pinned = pinned and self.device.type == "cuda"
        self._host = torch.zeros(total, dtype=torch.int64, pin_memory=pinned)
        self._dev = self._host if self.device.type == "cpu" else torch.zeros(total, dtype=torch.int64,
                                                                               device=self.device)
        self.h: dict[str, np.ndarray] = {}
        self.d: dict[str, torch.Tensor] = {}
        host_np, offset = self._host.numpy(), 0
        for name, shape in shapes:
            n = int(np.prod(shape))
            self.h[name] = host_np[offset:offset + n].reshape(shape)
            self.d[name] = self._dev[offset:offset + n].view(shape)
            offset += n
        self.num_groups = num_groups
        self._copied = None      # CUDA event: the last host-to-device copy has read the host buffer

    @classmethod
    def for_items(cls, items, tables, *, tpb: int, device) -> "StepBuffers":
        """Buffers of exactly one eager step's size."""
        t = sum(len(it.token_ids) for it in items)
        width = max((ceil_div(it.start + len(it.token_ids), tpb) for it in items), default=1)
        return cls(num_tokens=t, num_seqs=len(items), num_logits=sum(it.num_logits for it in items),
                   width=width, num_groups=len(tables[0]) if tables else 1, device=device)

    def fill(self, items, tables, *, tpb: int, pad_tables=None, pad_q_len: int | None = None) -> Filled:
        """Write ``items`` (decodes first) with their per-group block-table rows ``tables``; pad the rest.

        ``pad_q_len`` set: row-wise padding (rows of ``pad_q_len`` tokens at positions 0.., on ``pad_tables``);
        otherwise bulk padding. Raises ``ValueError`` when the items do not fit, ``RuntimeError`` when a new
        token has no page (capacity must cover every new token).
        """
        h, n, S, T = self.h, len(items), self.num_seqs, self.num_tokens
        if self._copied is not None:   # an overlapped loop refills while the last copy may still be queued
            self._copied.synchronize()
        q_list = [len(it.token_ids) for it in items]
        q_lens = np.array(q_list, np.int64).reshape(n)
        starts = np.array([it.start for it in items], np.int64).reshape(n)
        t = int(q_lens.sum())
        if n > S or t > T or (t < T and n == S):
            raise ValueError(f"a step of {n} sequences and {t} tokens does not fit buffers of {S} rows and "
                             f"{T} tokens (padding needs a spare row)")
        qs = h["query_start"]
        qs[0] = 0
        np.cumsum(q_lens, out=qs[1:n + 1])
        h["input_ids"][:t] = list(itertools.chain.from_iterable([it.token_ids for it in items]))
        h["input_ids"][t:] = 0
        seq_lens = h["seq_lens"]
        seq_lens[:n] = starts + q_lens
        if n < S:
            if pad_q_len is not None:
                if (S - n) * pad_q_len != T - t:
                    raise ValueError(f"row-wise padding of {S - n} rows x {pad_q_len} tokens != {T - t} spare tokens")
                qs[n + 1:] = t + pad_q_len * np.arange(1, S - n + 1)
                seq_lens[n:] = pad_q_len
            else:
                qs[n + 1:] = T
                seq_lens[n:] = 0
        row_of = np.repeat(np.arange(S), np.diff(qs))
        pos = h["positions"]
        pos[:] = np.arange(T) - qs[row_of]
        pos[:t] += starts[row_of[:t]]
        if n < S and pad_q_len is None:
            pos[t:] = 0
        page, offset = pos // tpb, pos % tpb
        need = ceil_div(seq_lens[:n], tpb)
        rows = np.repeat(np.arange(n), need)
        cols = np.arange(rows.size) - np.repeat(np.cumsum(need) - need, need)
        need_list = need.tolist()
        for g in range(self.num_groups):
            bt = h[f"block_table{g}"]
            bt.fill(-1)
            lists = [tab[g] for tab in tables]
            if [len(blocks) for blocks in lists] != need_list:   # some table holds more than the step reads
                lists = [blocks[:k] for blocks, k in zip(lists, need_list)]
            try:
                bt[rows, cols] = np.fromiter(itertools.chain.from_iterable(lists), np.int64, rows.size)
            except ValueError:   # a table shorter than the KV length it must cover
                i = next(i for i, tab in enumerate(tables) if len(tab[g]) < need[i])
                raise RuntimeError(f"request {items[i].request_id!r}: layer group {g} holds {len(tables[i][g])} "
                                   f"blocks but the step reads KV length {int(seq_lens[i])}; capacity must cover "
                                   f"it") from None
            if n < S:
                pad = pad_tables[g]
                bt[n:, :len(pad)] = pad
            blk = bt[row_of, page]
            if (blk < 0).any():
                j = int(np.flatnonzero(blk < 0)[0])
                rid = items[row_of[j]].request_id if row_of[j] < n else "(padding)"
                raise RuntimeError(f"request {rid!r}: position {int(pos[j])} (logical block {int(page[j])}) of layer "
                                   f"group {g} has no page; capacity must cover every new token")
            h[f"slot_block{g}"][:] = blk
            h[f"slot_offset{g}"][:] = offset
        lr = h["logit_rows"]
        wanted = [it.num_logits for it in items]
        k = sum(wanted)
        if k > self.num_logits:
            raise ValueError(f"{k} logit rows asked, the buffers return {self.num_logits}")
        if wanted.count(1) == n:
            lr[:n] = qs[1:n + 1] - 1
        elif k:     # each item's last w tokens: its end less w, plus 0 .. w - 1
            w = np.array(wanted, np.int64)
            lr[:k] = np.repeat(qs[1:n + 1] - w, w) + np.arange(k) - np.repeat(np.cumsum(w) - w, w)
        lr[k:] = 0
        if self._dev is not self._host:
            self._dev.copy_(self._host, non_blocking=self._host.is_pinned())
            if self._host.is_pinned():
                self._copied = torch.cuda.Event()
                self._copied.record()
        uniform = 0
        if n:
            q0 = q_list[0]
            if q_list.count(q0) == n and all(it.decode for it in items):   # a decode step: every row alike
                uniform = n
            while uniform < n and items[uniform].decode and q_list[uniform] == q0:
                uniform += 1
            if uniform == n and pad_q_len == q0:
                uniform = S
        return Filled(uniform, q0 if n else (pad_q_len or 1), k)
