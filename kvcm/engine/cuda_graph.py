"""CUDA-graph capture and replay of decode steps (SEMANTICS 7).

Shapes ``(batch size, draft len)`` come from ``kvcm.plan_warmup``: for each one it makes the ``bs - 1`` short
generation dummies and the long one sized by ``get_num_available_tokens``; a shape whose dummies do not fit
is *skipped* (with the reason) and later runs eagerly. For a shape that fits, a :class:`StaticDecode` is built:
static input ids, positions, per layer group block tables (padded to ``ceil(max_seq_len / tpb)`` columns),
slot mappings and KV lengths, and the decode forward runs on them. On CUDA it is captured into a graph; on the
CPU the same static path runs eagerly, so it is tested everywhere.

Batches smaller than a captured size are padded: a padding row writes its K/V to a page of its own (the
*pad request*, one block per layer group held by the engine) and attends only to that slot, so it can never
touch a real request's pages.

Warmup runs twice, as engines do: on the estimation cache (a temporary manager; its dummies are run once,
eagerly, since graphs captured there would point at pages about to be freed) and on the final cache, where the
graphs are captured. Replaying a graph gives the same greedy tokens as the eager path.
"""
from __future__ import annotations

import torch

from .attention import AttentionContext, GroupMeta
from .runner import ModelRunner, StepItem

PAD_REQUEST = "__kvcm_graph_pad__"


class StaticDecode:
    """Static buffers and the decode forward for ``bs`` sequences of ``q_len`` query tokens each."""

    def __init__(self, runner: ModelRunner, bs: int, q_len: int, max_seq_len: int, pad_tables: list[list[int]]):
        self.runner, self.bs, self.q_len = runner, bs, q_len
        dev, tpb = runner.device, runner.tpb
        self.max_blocks = -(-max_seq_len // tpb)
        self.pad_blocks = [t[0] for t in pad_tables]
        n = bs * q_len
        self.input_ids = torch.zeros(n, dtype=torch.long, device=dev)
        self.positions = torch.zeros(n, dtype=torch.long, device=dev)
        self.kv_lens = torch.ones(bs, dtype=torch.long, device=dev)
        self.groups = [GroupMeta(w, torch.zeros(n, dtype=torch.long, device=dev),
                                 torch.zeros(n, dtype=torch.long, device=dev),
                                 torch.full((bs, self.max_blocks), -1, dtype=torch.long, device=dev))
                       for w in runner.windows]
        self.graph = None
        self.logits = None

    def fill(self, items: list[StepItem]) -> None:
        """Copy a step's metadata into the static buffers; rows past ``len(items)`` become padding."""
        if len(items) > self.bs or any(len(it.token_ids) != self.q_len for it in items):
            raise ValueError(f"static decode (bs={self.bs}, q_len={self.q_len}) cannot run "
                             f"{len(items)} items of query lengths {sorted({len(it.token_ids) for it in items})}")
        tpb, ql, mgr = self.runner.tpb, self.q_len, self.runner.mgr
        pad = self.bs - len(items)
        ids, pos, lens = [], [], []
        for it in items:
            ids += it.token_ids
            pos += range(it.start, it.start + ql)
            lens.append(it.start + ql)
        ids += [0] * (pad * ql)
        pos += [0] * (pad * ql)
        lens += [1] * pad
        tables = [mgr.block_table(it.request_id) for it in items]
        for g, meta in enumerate(self.groups):
            blk, off, rows = [], [], []
            for it, tab in zip(items, tables):
                row = tab[g]
                for p in range(it.start, it.start + ql):
                    b, o = self.runner._slot(row, p, it.request_id, g)
                    blk.append(b)
                    off.append(o)
                need = -(-(it.start + ql) // tpb)
                rows.append(row[:need] + [-1] * (self.max_blocks - need))
            blk += [self.pad_blocks[g]] * (pad * ql)
            off += [0] * (pad * ql)
            rows += [[self.pad_blocks[g]] + [-1] * (self.max_blocks - 1)] * pad
            meta.slot_block.copy_(torch.tensor(blk, dtype=torch.long), non_blocking=True)
            meta.slot_offset.copy_(torch.tensor(off, dtype=torch.long), non_blocking=True)
            meta.dec_block_table.copy_(torch.tensor(rows, dtype=torch.long), non_blocking=True)
        self.input_ids.copy_(torch.tensor(ids, dtype=torch.long), non_blocking=True)
        self.positions.copy_(torch.tensor(pos, dtype=torch.long), non_blocking=True)
        self.kv_lens.copy_(torch.tensor(lens, dtype=torch.long), non_blocking=True)

    def forward(self) -> torch.Tensor:
        """The graph-safe decode forward: tensors only, fixed shapes; logits for every row."""
        r = self.runner
        ctx = AttentionContext(r.layer_kv, r.group_of_layer, r.tpb, self.groups, num_decode=self.bs,
                               decode_q_len=self.q_len, dec_kv_lens=self.kv_lens)
        hidden = r.forward_hidden(self.input_ids, self.positions, ctx)
        return r.lm_head(hidden)

    def capture(self, pool=None) -> None:
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):
                self.forward()
        torch.cuda.current_stream().wait_stream(stream)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph, pool=pool):
            self.logits = self.forward()

    def run(self, items: list[StepItem]) -> torch.Tensor:
        """Logits of each item's last query token, [len(items), vocab]."""
        self.fill(items)
        if self.graph is not None:
            self.graph.replay()
            logits = self.logits
        else:
            logits = self.forward()
        return logits.view(self.bs, self.q_len, -1)[:len(items), -1]


class DecodeGraphs:
    """The captured (or, on the CPU, statically run) decode shapes of one manager."""

    def __init__(self, runner: ModelRunner, max_seq_len: int, *, capture: bool | None = None):
        self.runner, self.mgr, self.max_seq_len = runner, runner.mgr, max_seq_len
        self.capture = runner.device.type == "cuda" if capture is None else capture
        if self.capture and runner.device.type != "cuda":
            raise ValueError(f"CUDA graphs need device='cuda', got {runner.device}")
        self.shapes: dict[tuple[int, int], StaticDecode] = {}
        self.reports = []
        self.num_replays = 0      # decode steps served by a static shape (graph replays on CUDA)
        self.pool = torch.cuda.graph_pool_handle() if self.capture else None
        if not self.mgr.has_request(PAD_REQUEST):
            self.mgr.begin_context_chunk(PAD_REQUEST, 0, 1, 1)
        self.pad_tables = self.mgr.block_table(PAD_REQUEST)

    def release(self) -> None:
        self.shapes.clear()
        if self.mgr.has_request(PAD_REQUEST):
            self.mgr.free_resources(PAD_REQUEST)

    @torch.inference_mode()
    def warmup(self, *, batch_sizes=None, draft_lens=None, two_model: bool = False, cache: str = "final",
               keep: bool = True):
        """Plan, fit, run (and on CUDA capture) every shape; returns the ``kvcm.WarmupReport``."""
        import kvcm

        def on_fit(shape, dummies):
            q_len = 1 + shape.draft_len
            static = StaticDecode(self.runner, shape.batch_size, q_len, self.max_seq_len, self.pad_tables)
            static.fill(self.runner.dummy_items(dummies))
            if self.capture and keep:
                static.capture(self.pool)
            else:
                static.forward()
            if keep:
                self.shapes[(shape.batch_size, q_len)] = static

        report = kvcm.plan_warmup(self.mgr, batch_sizes=batch_sizes, draft_lens=draft_lens, two_model=two_model,
                                  cache=cache, on_fit=on_fit)
        self.reports.append(report)
        return report

    def _pick(self, items: list[StepItem]) -> StaticDecode | None:
        if not items or not all(it.decode for it in items):
            return None
        q_len = len(items[0].token_ids)
        fits = [bs for (bs, ql) in self.shapes if ql == q_len and bs >= len(items)]
        return self.shapes[(min(fits), q_len)] if fits else None

    def can_run(self, items: list[StepItem]) -> bool:
        return self._pick(items) is not None

    @torch.inference_mode()
    def run(self, items: list[StepItem]) -> torch.Tensor:
        static = self._pick(items)
        if static is None:
            raise ValueError(f"no captured decode shape for {len(items)} items")
        self.runner._trace(items)
        self.num_replays += 1
        return static.run(items)


def estimation_manager(llm):
    """The temporary cache engines warm up on first: ``kvcm.estimation``'s config (typical length =
    max_seq_len, the whole free-memory fraction) on CUDA; on the CPU (no free-memory figure) a second manager
    of the same config."""
    import kvcm
    from kvcm.estimation import estimation_config
    cfg = llm.kv_cache_config
    if llm.device.type == "cuda":
        cfg = estimation_config(cfg).replace(avg_seq_len=llm.max_seq_len)
    return kvcm.create_kv_cache_manager(llm.manager_version, llm.model_spec, cfg,
                                        **llm.manager_kwargs())


def warmup_estimation(llm, *, batch_sizes=None, draft_lens=None, two_model=False):
    """Warm up on a temporary estimation cache and free it; returns its report."""
    est = estimation_manager(llm)
    try:
        graphs = DecodeGraphs(ModelRunner(llm.model, est, llm.device), llm.max_seq_len, capture=False)
        report = graphs.warmup(batch_sizes=batch_sizes, draft_lens=draft_lens, two_model=two_model,
                               cache="estimation", keep=False)
        graphs.release()
    finally:
        del est
        if llm.device.type == "cuda":
            torch.cuda.empty_cache()
    return report


def setup_cuda_graphs(llm, *, batch_sizes=None, estimation: bool = True, capture: bool | None = None):
    """Estimation warmup, then capture on the final cache. Draft shapes D (and 0, which plain decode uses)."""
    d = llm.max_draft_len
    two_model = d > 0
    reports = [warmup_estimation(llm, batch_sizes=batch_sizes, two_model=two_model)] if estimation else []
    graphs = DecodeGraphs(llm.runner, llm.max_seq_len, capture=capture)
    reports.append(graphs.warmup(batch_sizes=batch_sizes, two_model=two_model))
    llm.warmup_reports = reports
    return graphs
