"""Model runner: turns a scheduled step into one packed forward over the paged cache and returns the logits of
each sequence's last token.

The decoder body (``model.model``) runs on every token; the LM head only on the rows whose logits are sampled,
which for a long prefill is most of the head's cost saved. The manager calls (begin/end of a chunk or a step)
are the scheduler's job; the runner only reads block tables and histories.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

from . import attention
from .attention import AttentionContext, GroupMeta
from .trace import Tracer


@dataclass
class StepItem:
    """One sequence's share of a forward: ``token_ids`` sit at positions ``start ..``; decodes come first."""
    request_id: object
    token_ids: list[int]
    start: int
    decode: bool
    want_logits: bool = True
    phase: str = ""


class ModelRunner:
    def __init__(self, model, mgr, device="cpu", tracer: Tracer | None = None):
        self.model, self.mgr = model, mgr
        self.device = torch.device(device)
        self.tracer = tracer
        self.base = getattr(model, model.base_model_prefix)
        self.lm_head = model.get_output_embeddings()
        self.tpb = mgr.tokens_per_block
        self.num_layers = model.config.num_hidden_layers
        self.layer_kv = {li: mgr.layer_kv(li) for li in range(self.num_layers)}
        self.group_of_layer = {li: mgr.group_of_layer(li) for li in range(self.num_layers)}
        self.windows = [g.window for g in mgr.layer_groups]
        # every config object the attention modules read ``_attn_implementation`` from
        self._configs = list({id(m.config): m.config for m in model.modules()
                              if hasattr(m, "config") and hasattr(m.config, "_attn_implementation")}.values())
        attention.register()

    @contextlib.contextmanager
    def paged(self):
        """Route the model's attention to the paged function for one forward, then restore: the same model
        object can still run Hugging Face ``generate`` (eager / sdpa) outside the engine."""
        saved = [c._attn_implementation for c in self._configs]
        for c in self._configs:
            c._attn_implementation = attention.NAME
        try:
            yield
        finally:
            for c, s in zip(self._configs, saved):
                c._attn_implementation = s
            attention.set_context(None)

    # ---- metadata --------------------------------------------------------------------------------------------
    def _slot(self, table: list[int], p: int, rid, g: int) -> tuple[int, int]:
        b = table[p // self.tpb] if p // self.tpb < len(table) else -1
        if b < 0:
            raise RuntimeError(f"request {rid!r}: position {p} (logical block {p // self.tpb}) of layer group {g} "
                               f"has no page (table length {len(table)}); capacity must cover every new token")
        return b, p % self.tpb

    def build_context(self, items: list[StepItem]) -> AttentionContext:
        tpb, dev = self.tpb, self.device
        decodes = [it for it in items if it.decode]
        q_lens = {len(it.token_ids) for it in decodes}
        if len(q_lens) > 1:
            raise ValueError(f"decode items must share one query length, got {sorted(q_lens)}")
        tables = [self.mgr.block_table(it.request_id) for it in items]
        groups = []
        for g, window in enumerate(self.windows):
            blocks, offsets = [], []
            for it, tab in zip(items, tables):
                for p in range(it.start, it.start + len(it.token_ids)):
                    b, o = self._slot(tab[g], p, it.request_id, g)
                    blocks.append(b)
                    offsets.append(o)
            meta = GroupMeta(window, torch.tensor(blocks, dtype=torch.long, device=dev),
                             torch.tensor(offsets, dtype=torch.long, device=dev))
            if decodes:
                need = [-(-(it.start + len(it.token_ids)) // tpb) for it in decodes]
                width = max(need)
                rows = [tab[g][:n] + [-1] * (width - n) for tab, n in zip(tables, need)]
                meta.dec_block_table = torch.tensor(rows, dtype=torch.long, device=dev)
            for it, tab in zip(items[len(decodes):], tables[len(decodes):]):
                first = max(0, (it.start + 1 - window) // tpb) if window else 0
                last = (it.start + len(it.token_ids) - 1) // tpb
                ids = tab[g][first:last + 1]
                if len(ids) != last + 1 - first or min(ids) < 0:
                    raise RuntimeError(f"request {it.request_id!r}: layer group {g} lacks a page in blocks "
                                       f"{first}..{last} the chunk at position {it.start} attends to: {ids}")
                meta.prefill_blocks.append(torch.tensor(ids, dtype=torch.long, device=dev))
                meta.prefill_first_block.append(first)
            groups.append(meta)
        ctx = AttentionContext(self.layer_kv, self.group_of_layer, tpb, groups, num_decode=len(decodes),
                               decode_q_len=q_lens.pop() if q_lens else 1)
        if decodes:
            ctx.dec_kv_lens = torch.tensor([it.start + len(it.token_ids) for it in decodes], dtype=torch.long,
                                           device=dev)
        qs = sum(len(it.token_ids) for it in decodes)
        for it in items[len(decodes):]:
            ctx.prefill.append((qs, len(it.token_ids), it.start))
            qs += len(it.token_ids)
        return ctx

    # ---- forward ---------------------------------------------------------------------------------------------
    def _trace(self, items: list[StepItem]) -> None:
        if self.tracer is None:
            return
        for it in items:
            phase = it.phase or ("decode" if it.decode else "prefill")
            self.tracer.record(self.mgr, it.request_id, phase, self.mgr.get_history(it.request_id),
                               it.start + len(it.token_ids), len(it.token_ids))
        self.tracer.step += 1

    def forward_hidden(self, input_ids: torch.Tensor, positions: torch.Tensor, ctx: AttentionContext):
        """The decoder body on a packed batch: ids/positions [T] -> hidden states [T, hidden]."""
        with self.paged():
            attention.set_context(ctx)
            out = self.base(input_ids=input_ids[None], position_ids=positions[None], use_cache=False)
        return out.last_hidden_state[0]

    @torch.inference_mode()
    def run(self, items: list[StepItem]) -> torch.Tensor:
        """One packed forward; returns logits [num items wanting logits, vocab] (their last token's)."""
        order = sorted(range(len(items)), key=lambda i: not items[i].decode)
        if order != list(range(len(items))):
            raise ValueError("decode items must come before prefill items")
        ctx = self.build_context(items)
        ids, pos, last = [], [], []
        for it in items:
            ids.extend(it.token_ids)
            pos.extend(range(it.start, it.start + len(it.token_ids)))
            if it.want_logits:
                last.append(len(ids) - 1)
        self._trace(items)
        hidden = self.forward_hidden(torch.tensor(ids, dtype=torch.long, device=self.device),
                                     torch.tensor(pos, dtype=torch.long, device=self.device), ctx)
        if not last:
            return hidden.new_empty((0, self.lm_head.out_features))
        return self.lm_head(hidden[torch.tensor(last, device=self.device)])

    def dummy_items(self, dummies) -> list[StepItem]:
        """Decode items for generation dummies (``mgr.add_dummy_requests(..., is_gen=True)``): each runs
        ``1 + max_num_draft_tokens`` input tokens at its history, as a real decode step at that size would."""
        items = []
        for d in dummies:
            n = 1 + d.max_num_draft_tokens
            items.append(StepItem(d.request_id, [0] * n, self.mgr.get_history(d.request_id), decode=True,
                                  phase="dummy"))
        return items

    def run_dummy_decode(self, dummies) -> torch.Tensor:
        """A warmup forward on dummy requests (what CUDA-graph warmup runs before capture)."""
        return self.run(self.dummy_items(dummies))
