"""Model runner: turns a scheduled step into one packed forward over the paged cache and returns the logits of
each sequence's last token (or last ``num_logits`` tokens).

The decoder body (``model.model``) runs on every token; the LM head only on the rows whose logits are sampled,
which for a long prefill is most of the head's cost saved. The manager calls (begin/end of a chunk or a step)
are the scheduler's job; the runner only reads block tables and histories. The same ``fill`` + ``forward``
serve an eager step (buffers sized to it) and a CUDA graph (fixed buffers, padded: ``cuda_graph.py``).
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

from ..protocols import StepManager
from . import attention, fused, fused_layers, triton_attention
from .attention import AttentionContext, GroupMeta, KernelOptions
from .batch import Filled, StepBuffers
from .trace import Tracer


@dataclass(slots=True)
class StepItem:
    """One sequence's share of a forward: ``token_ids`` sit at positions ``start ..``; decodes come first.
    ``num_logits``: how many of its last positions' logits the step returns (0 for a prefill chunk that does not
    end the prompt, 1 + drafts for a speculative verification)."""
    request_id: object
    token_ids: list[int]
    start: int
    decode: bool
    num_logits: int = 1
    phase: str = ""

    @property
    def want_logits(self) -> bool:
        return self.num_logits > 0


class ModelRunner:
    def __init__(self, model, mgr: StepManager, device="cpu", tracer: Tracer | None = None,
                 kernel: KernelOptions = KernelOptions()):
        """``kernel``: how the Triton attention kernel tiles decode and prefill steps (``KernelOptions``)."""
        self.model, self.mgr = model, mgr
        self.kernel = kernel
        self.device = torch.device(device)
        self.tracer = tracer
        # the decoder body; Llama 4's text model keeps the multimodal wrapper's prefix (language_model) but holds
        # its body as ``model``
        self.base = getattr(model, model.base_model_prefix, None) or model.model
        self.lm_head = model.get_output_embeddings()
        self.tpb = mgr.tokens_per_block
        self.num_layers = model.config.num_hidden_layers
        self.layer_kv = {li: mgr.layer_kv(li) for li in range(self.num_layers)}
        self.group_of_layer = {li: mgr.group_of_layer(li) for li in range(self.num_layers)}
        self.attention_types = [g.attention for g in mgr.layer_groups]
        self.use_kernel = triton_attention.available(self.device.type)
        self.fused = fused.fused_ops(model, self.device)
        self.layers = fused_layers.fused_layers(model, self.device) if kernel.fused_layers else None
        # the sampled token of each logit row of the last step, where the next step's placeholders read it
        self.last_tokens = torch.zeros((mgr.max_batch_size + 1) * (1 + mgr.max_draft_len), dtype=torch.long,
                                       device=self.device)
        # every config object the attention modules read ``_attn_implementation`` from
        self._configs = list({id(m.config): m.config for m in model.modules()
                              if hasattr(m, "config") and hasattr(m.config, "_attn_implementation")}.values())
        attention.register()

    @contextlib.contextmanager
    def paged(self):
        """Route the model's attention to the paged function (and, where the kernels run, its small ops to the
        fused ones) for one forward, then restore: the same model object can still run Hugging Face ``generate``
        (eager / sdpa) outside the engine."""
        saved = [c._attn_implementation for c in self._configs]
        for c in self._configs:
            c._attn_implementation = attention.NAME
        try:
            with self.fused.swapped() if self.fused is not None else contextlib.nullcontext():
                yield
        finally:
            for c, s in zip(self._configs, saved):
                c._attn_implementation = s
            attention.set_context(None)

    # ---- metadata --------------------------------------------------------------------------------------------
    def tables(self, items: list[StepItem]) -> list[list[list[int]]]:
        """Each item's block table (per layer group), read-only: the fill copies what it needs at once."""
        return self.mgr.block_tables([it.request_id for it in items])

    def fill(self, buf: StepBuffers, items: list[StepItem], tables=None, **pad) -> AttentionContext:
        """Write a step into ``buf``; returns the attention context over ``buf``'s device tensors."""
        return self.context(buf, self.fill_buffers(buf, items, tables, **pad))

    def fill_buffers(self, buf: StepBuffers, items: list[StepItem], tables=None, **pad) -> Filled:
        """Write a step into ``buf`` (a static step keeps the context it made at its first fill)."""
        decode = [it.decode for it in items]
        if True in decode[decode.count(True):]:    # a decode after the leading ones
            raise ValueError("decode items must come before prefill items")
        return buf.fill(items, self.tables(items) if tables is None else tables, tpb=self.tpb, **pad)

    def context(self, buf: StepBuffers, filled: Filled) -> AttentionContext:
        d = buf.d
        groups = [GroupMeta(t, d[f"slot_block{g}"], d[f"slot_offset{g}"], d[f"block_table{g}"])
                  for g, t in enumerate(self.attention_types)]
        # a step of decodes only (every row, a graph's padding rows too, alike): its keys may be split; any other
        # step carries prefill and takes the prefill tile. A static step keeps this context, so a token bucket
        # (first filled with padding only) never splits
        decode = filled.num_uniform == buf.num_seqs > 0
        k = self.kernel
        return AttentionContext(self.layer_kv, self.group_of_layer, self.tpb, groups, d["seq_lens"],
                                d["query_start"], buf.h["seq_lens"], buf.h["query_start"],
                                num_uniform=filled.num_uniform, uniform_q_len=filled.uniform_q_len,
                                use_kernel=self.use_kernel,
                                split_len=k.decode_split_len if decode else 0,
                                block_m=None if decode else k.prefill_block_m, positions=d["positions"],
                                pipelined=k.pipelined_keys,
                                decode_q_len=filled.uniform_q_len if decode and k.decode_rows_by_index else 0,
                                program_maps={} if k.step_row_map else None)

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
        """The decoder body on a packed batch: ids/positions [T] -> hidden states [T, hidden]. The kernel's program
        maps are emptied first: each forward (a CUDA graph's capture too) fills them itself."""
        if ctx.program_maps:
            ctx.program_maps.clear()
        if self.layers is not None:
            return self.layers.forward(input_ids, positions, ctx)
        with self.paged():
            attention.set_context(ctx)
            out = self.base(input_ids=input_ids[None], position_ids=positions[None], use_cache=False)
        return out.last_hidden_state[0]

    def resolve_placeholders(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Input ids with each placeholder (:func:`placeholders`, negative) replaced by the token the
        previous step sampled for that logit row: the host schedules a step before it has read the last one's
        tokens, and the device, which has them, fills them in."""
        return torch.where(input_ids < 0, self.last_tokens[placeholder_rows(input_ids)], input_ids)

    def publish(self, packed: torch.Tensor, n: int) -> None:
        """Keep the first ``n`` sampled tokens of a step (``sampler.greedy_packed`` output) on the device for
        the next step's placeholders."""
        self.last_tokens[:n].copy_(packed[0, :n])

    def forward(self, buf: StepBuffers, ctx: AttentionContext) -> torch.Tensor:
        """Logits of ``buf``'s logit rows, [R, vocab]; tensors only, so a CUDA graph can capture it."""
        hidden = self.forward_hidden(self.resolve_placeholders(buf.d["input_ids"]), buf.d["positions"], ctx)
        return self.lm_head(hidden[buf.d["logit_rows"]])

    @torch.inference_mode()
    def run(self, items: list[StepItem]) -> torch.Tensor:
        """One packed forward; returns logits [sum of num_logits, vocab] in item order."""
        tables = self.tables(items)
        buf = StepBuffers.for_items(items, tables, tpb=self.tpb, device=self.device)
        ctx = self.fill(buf, items, tables)
        self._trace(items)
        return self.forward(buf, ctx)

    def dummy_items(self, dummies) -> list[StepItem]:
        """Decode items for generation dummies (``mgr.add_dummy_requests(..., is_gen=True)``): each runs
        ``1 + max_num_draft_tokens`` input tokens at its history, as a real decode step at that size would."""
        items = []
        for d in dummies:
            n = 1 + d.max_num_draft_tokens
            items.append(StepItem(d.request_id, [0] * n, self.mgr.get_history(d.request_id), decode=True,
                                  num_logits=n, phase="dummy"))
        return items

    def run_dummy_decode(self, dummies) -> torch.Tensor:
        """A warmup forward on dummy requests (what CUDA-graph warmup runs before capture)."""
        return self.run(self.dummy_items(dummies))


def placeholders(n: int) -> range:
    """The stand-in token ids of logit rows ``0 .. n - 1`` of the step in flight: negative, so never a real id.
    The scheduler writes them (``Scheduler.commit``, indexing this range rather than calling per sequence) and
    the runner swaps each for its row's sampled token on the device (``ModelRunner.resolve_placeholders``,
    through :func:`placeholder_rows`): the encoding lives here alone."""
    return range(-1, -1 - n, -1)


def placeholder(row: int) -> int:
    """The stand-in token id of logit row ``row`` (:func:`placeholders`)."""
    return placeholders(row + 1)[row]


def placeholder_rows(input_ids: torch.Tensor) -> torch.Tensor:
    """The logit row each placeholder of ``input_ids`` stands for (0 where an id is a real token)."""
    return (-1 - input_ids).clamp(min=0)
