"""CUDA-graph capture and replay of engine steps (docs/semantics.md 7), and the graph-safe static path behind it.

*Decode shapes* ``(batch size, draft len)`` come from ``kvcm.plan_warmup``: for each one it makes the
``bs - 1`` short generation dummies and the long one sized by ``get_num_available_tokens``; a shape whose
dummies do not fit is *skipped* (with the reason) and its batches later run eagerly. A shape that fits gets a
:class:`StaticStep` of ``bs`` rows of ``1 + draft`` queries, filled from the dummies and captured. Batches
smaller than a captured size are padded row-wise: a padding row writes its K/V to the engine's own *pad
request* (held in every layer group) and attends only to it, so it can never touch a real request's pages.

*Token buckets* (CUDA with the Triton kernels): steps that mix decodes and prefill chunks, which continuous
batching makes most steps once requests come and go, replay a graph of ``T`` tokens and up to
``max_batch_size`` sequences, padded in bulk (one padding row of KV length 0, so attention skips it). The
kernels' launch shape depends only on (tokens, rows), so one capture serves every mix that fits.

Warmup runs twice, as engines do: on the estimation cache (a temporary manager; its dummies are run once,
eagerly, since graphs captured there would point at pages about to be freed) and on the final cache, where the
graphs are captured (``kvcm/engine/cache.py`` builds a model's cache, with or without a :class:`GraphPlan`,
and calls :func:`warm_eagerly` and :func:`setup_cuda_graphs` when there is one). On the CPU the static path runs eagerly (``capture=False``), so the
suites test it everywhere; replaying a graph gives the same greedy tokens as the eager path.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..units import ceil_div
from ..warmup import plan_warmup
from . import sampler
from .batch import StepBuffers
from .runner import ModelRunner, StepItem

PAD_REQUEST = "__kvcm_graph_pad__"


@dataclass(frozen=True)
class StepShape:
    """What decides which static step can run a step: sequences, tokens, logit rows, and the query length
    when every item is a decode of the same length (else None)."""
    num_seqs: int
    num_tokens: int
    num_logits: int
    decode_q_len: int | None

    @classmethod
    def of(cls, items: list[StepItem]) -> "StepShape":
        q_lens = [len(it.token_ids) for it in items]
        q = q_lens[0] if items and q_lens.count(q_lens[0]) == len(q_lens) and all(it.decode for it in items) \
            else None
        return cls(len(items), sum(q_lens), sum(it.num_logits for it in items), q)


class StaticStep:
    """Fixed buffers for ``num_tokens`` tokens of up to ``num_seqs`` sequences, and the forward over them.
    ``q_len`` set: a decode shape (every row ``q_len`` queries, row-wise padding); else a bulk-padded bucket."""

    def __init__(self, runner: ModelRunner, *, num_tokens: int, num_seqs: int, num_logits: int,
                 max_seq_len: int, pad_tables: list[list[int]], q_len: int | None = None):
        self.runner, self.q_len, self.pad_tables = runner, q_len, pad_tables
        self.buf = StepBuffers(num_tokens=num_tokens, num_seqs=num_seqs, num_logits=num_logits,
                               width=ceil_div(max_seq_len, runner.tpb), num_groups=len(runner.attention_types),
                               device=runner.device, pinned=True)
        self.ctx = None
        self.graph = None
        self.greedy = None          # [2, R] tokens and margins of every logit row, computed inside the graph

    @property
    def num_tokens(self) -> int:
        return self.buf.num_tokens

    def fits(self, shape: "StepShape") -> bool:
        b = self.buf
        if shape.num_seqs == 0 or shape.num_seqs > b.num_seqs or shape.num_logits > b.num_logits:
            return False
        if self.q_len is not None:
            return shape.decode_q_len == self.q_len
        return shape.num_tokens == b.num_tokens or (shape.num_tokens < b.num_tokens and shape.num_seqs < b.num_seqs)

    def fill(self, items: list[StepItem], *, checked: bool = False) -> int:
        """Copy a step into the buffers (``checked``: ``fits`` already said yes); returns how many logit rows
        are real."""
        if items and not checked and not self.fits(StepShape.of(items)):
            raise ValueError(f"a step of {len(items)} items does not fit the static step of {self.buf.num_seqs} "
                             f"rows and {self.buf.num_tokens} tokens (query length {self.q_len})")
        filled = self.runner.fill_buffers(self.buf, items, pad_tables=self.pad_tables, pad_q_len=self.q_len)
        if self.ctx is None:
            self.ctx = self.runner.context(self.buf, filled)
        else:   # the captured context: same tensors; the host-side row split is refreshed for the torch path
            self.ctx.num_uniform, self.ctx.uniform_q_len, self.ctx.cache = filled.num_uniform, filled.uniform_q_len, {}
        return filled.num_logits

    def forward(self) -> torch.Tensor:
        """The graph-safe forward and greedy choice: [2, R] (``sampler.greedy_packed`` of every logit row)."""
        return sampler.greedy_packed(self.runner.forward(self.buf, self.ctx))

    def capture(self, pool=None) -> None:
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):
                self.forward()
        torch.cuda.current_stream().wait_stream(stream)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph, pool=pool):
            self.greedy = self.forward()

    def launch(self, items: list[StepItem], started=None) -> tuple[torch.Tensor, int]:
        """Fill and replay (on the CPU: run) without waiting: the [2, R] greedy tensor on the device and how
        many of its rows are real. The items are ones ``StepGraphs.pick`` chose this step for. ``started``: a
        CUDA event recorded between the fill and the replay (a profile's start of the step's GPU work)."""
        k = self.fill(items, checked=True)
        if started is not None:
            started.record()
        if self.graph is not None:
            self.graph.replay()
            return self.greedy, k
        return self.forward(), k

    def run(self, items: list[StepItem]) -> tuple[list[int], list[float]]:
        """Greedy tokens and margins of the items' logit rows (``sampler.greedy`` of their logits)."""
        return sampler.unpack(*self.launch(items))


def default_token_buckets(max_batch_size: int, max_num_tokens: int | None, *, limit: int = 8192) -> list[int]:
    """Default bucket sizes: powers of two from 16 to ``min(max_num_tokens or limit, limit)``."""
    top = min(max_num_tokens or limit, limit)
    sizes, t = [], 16
    while t < top:
        sizes.append(t)
        t *= 2
    return sizes + [top]


class StepGraphs:
    """The captured (or, on the CPU, statically run) steps of one manager: decode shapes and token buckets."""

    def __init__(self, runner: ModelRunner, max_seq_len: int, *, capture: bool | None = None):
        self.runner, self.mgr, self.max_seq_len = runner, runner.mgr, max_seq_len
        self.capture = runner.device.type == "cuda" if capture is None else capture
        if self.capture and runner.device.type != "cuda":
            raise ValueError(f"CUDA graphs need device='cuda', got {runner.device}")
        self.shapes: dict[tuple[int, int], StaticStep] = {}      # (batch size, query length) -> decode shape
        self.buckets: dict[int, StaticStep] = {}                 # tokens -> mixed-step bucket
        self.reports = []
        self.num_replays = 0      # steps served by a static step (graph replays on CUDA)
        self.num_bucket_replays = 0   # of which on a token bucket (steps with prefill chunks)
        self.pool = torch.cuda.graph_pool_handle() if self.capture else None
        self._make_pad()

    def _make_pad(self) -> None:
        if not self.mgr.has_request(PAD_REQUEST):
            q = 1 + self.mgr.max_draft_len          # padding rows of the widest decode shape fit its pages
            self.mgr.begin_context_chunk(PAD_REQUEST, 0, q, q)
        self.pad_tables = self.mgr.block_table(PAD_REQUEST)
        for static in (*self.shapes.values(), *self.buckets.values()):
            static.pad_tables = self.pad_tables

    def release(self) -> None:
        self.shapes.clear()
        self.buckets.clear()
        if self.mgr.has_request(PAD_REQUEST):
            self.mgr.free_resources(PAD_REQUEST)

    def reset_prefix_cache(self) -> bool:
        """The manager's ``reset_prefix_cache`` with the pad request out of its way: the manager refuses while any
        request holds a page (vLLM's rule), and the pad holds pages for as long as the graphs live. The pad is made
        again afterwards and every static step given its pages: a step copies its padding rows' block tables in
        at each fill, so a captured graph follows them."""
        self.mgr.free_resources(PAD_REQUEST)
        try:
            return self.mgr.reset_prefix_cache()
        finally:
            self._make_pad()

    def _static(self, **kw) -> StaticStep:
        return StaticStep(self.runner, max_seq_len=self.max_seq_len, pad_tables=self.pad_tables, **kw)

    @torch.inference_mode()
    def capture_buckets(self, sizes: list[int]) -> None:
        """Token buckets, largest first (they share the graph memory pool), filled with padding only."""
        rows = self.mgr.max_batch_size + 1
        for t in sorted(set(sizes), reverse=True):
            static = self._static(num_tokens=t, num_seqs=rows, num_logits=rows)
            static.fill([])
            if self.capture:
                static.capture(self.pool)
            self.buckets[t] = static

    @torch.inference_mode()
    def warmup(self, *, batch_sizes=None, draft_lens=None, two_model: bool = False, cache: str = "final",
               keep: bool = True):
        """Plan, fit, run (and on CUDA capture) every decode shape; returns the ``kvcm.WarmupReport``."""

        def on_fit(shape, dummies):
            q_len = 1 + shape.draft_len
            n = shape.batch_size * q_len
            static = self._static(num_tokens=n, num_seqs=shape.batch_size, num_logits=n, q_len=q_len)
            static.fill(self.runner.dummy_items(dummies))
            if self.capture and keep:
                static.capture(self.pool)
            else:
                static.forward()
            if keep:
                self.shapes[(shape.batch_size, q_len)] = static

        report = plan_warmup(self.mgr, batch_sizes=batch_sizes, draft_lens=draft_lens, two_model=two_model,
                             cache=cache, on_fit=on_fit)
        self.reports.append(report)
        return report

    def pick(self, items: list[StepItem]) -> StaticStep | None:
        """The smallest static step the items fit: a decode shape when there is one, else a token bucket."""
        shape = StepShape.of(items)
        fits = [s for s in self.shapes.values() if s.fits(shape)]
        if not fits:
            fits = [s for s in self.buckets.values() if s.fits(shape)]
        return min(fits, key=lambda s: s.num_tokens) if fits else None

    @torch.inference_mode()
    def launch(self, static: StaticStep, items: list[StepItem], started=None) -> tuple[torch.Tensor, int]:
        self.runner._trace(items)
        self.num_replays += 1
        self.num_bucket_replays += static.q_len is None
        return static.launch(items, started)

    def run(self, static: StaticStep, items: list[StepItem]) -> tuple[list[int], list[float]]:
        return sampler.unpack(*self.launch(static, items))


@dataclass(frozen=True)
class GraphPlan:
    """What the warmup captures: decode shapes of these batch sizes (default ``1, 2, 4 .. B``) and draft
    lengths (default ``max_draft_len``, and 0 too with ``two_model``), and token buckets (default
    ``default_token_buckets`` where the Triton kernels run). ``capture``: None = on CUDA only."""
    batch_sizes: tuple[int, ...] | None = None
    token_buckets: tuple[int, ...] | None = None
    draft_lens: tuple[int, ...] | None = None
    two_model: bool = False
    capture: bool | None = None


def setup_cuda_graphs(runner: ModelRunner, plan: GraphPlan) -> tuple[StepGraphs, list]:
    """On the runner's (final) manager: token buckets, then every planned decode shape; returns the graphs
    and the final cache's warmup report."""
    mgr = runner.mgr
    graphs = StepGraphs(runner, mgr.max_seq_len, capture=plan.capture)
    buckets = plan.token_buckets
    if buckets is None and runner.use_kernel:
        buckets = default_token_buckets(mgr.max_batch_size, mgr.max_num_tokens)
    graphs.capture_buckets(list(buckets or []))
    report = graphs.warmup(batch_sizes=plan.batch_sizes, draft_lens=plan.draft_lens, two_model=plan.two_model)
    return graphs, [report]


def warm_eagerly(model, device, plan: GraphPlan):
    """The estimation cache's warmup: every shape's dummies run once, eagerly, nothing kept."""
    def warm(mgr):
        graphs = StepGraphs(ModelRunner(model, mgr, device), mgr.max_seq_len, capture=False)
        report = graphs.warmup(cache="estimation", keep=False, batch_sizes=plan.batch_sizes,
                               draft_lens=plan.draft_lens, two_model=plan.two_model)
        graphs.release()
        return report
    return warm
