"""A step's kernels by class: which part of a decoder layer launched each, how long it ran, what it must move.

Attribution. Forward hooks open a ``record_function`` range around every module of a Llama-family model (its
projections, norms, attention, MLP, decoder layers, embedding, LM head). Under the torch profiler each device
kernel is linked to the host op that launched it (the profiler's correlation ids), and that op lies inside the
innermost range open at the time, which names the kernel's class. Kernels launched from a module's own body
rather than a child's take the module's class: inside attention the Triton kernels are told apart by name
(rotary, K/V write, attention), a matrix product in the attention or MLP body is a fused projection, and what a
decoder layer launches itself is its residual adds. On the CPU the "kernels" are the aten ops, each counted by its
self time, so the same table comes out of the profiler's CPU events.

Bytes. Each class's bytes are what it must move at least, from the model's shapes and the step's metadata (tokens,
KV lengths, logit rows): every weight once, every activation read once and written once, the KV of each row read
once, the new K/V written once. They do not depend on how a class is split into kernels, so a fused path and the
stock one are measured against the same work. The step's *bound* bytes are the weights, the KV read and the KV
written: what no kernel layout can avoid.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

import torch

LINEAR_CLASS = {"q_proj": "qkv_proj", "k_proj": "qkv_proj", "v_proj": "qkv_proj", "o_proj": "o_proj",
                "gate_proj": "gate_up_proj", "up_proj": "gate_up_proj", "down_proj": "down_proj",
                "lm_head": "lm_head", "embed_tokens": "embedding", "rotary_emb": "rotary"}
ORDER = ("embedding", "rmsnorm", "qkv_proj", "rotary", "kv_write", "attention", "o_proj", "residual_add",
         "gate_up_proj", "silu_mul", "down_proj", "lm_head", "sampler", "glue")
GEMM_NAME = re.compile(r"gemm|nvjet|xmma|cutlass|sm\d+_|matmul|aten::(mm|addmm|bmm|linear)$", re.I)
# the host ops that call cuBLAS themselves (aten::linear and aten::matmul only call these)
GEMM_OP = re.compile(r"aten::(mm|addmm|bmm|baddbmm|_addmm_activation|_scaled_mm)$")
# CUDA runtime and driver calls that launch a kernel: the profiler links each to its kernel by correlation id
LAUNCH_API = re.compile(r"^(cudaLaunch|cuLaunch|cudaGraphLaunch)")
TRITON_CLASS = (("rotary", "rotary"), ("store_kv", "kv_write"), ("paged_attention", "attention"),
                ("combine_splits", "attention"), ("rmsnorm", "rmsnorm"), ("silu_mul", "silu_mul"))
PREFIX = "kvcm_step::"


def module_class(path: str, module) -> str | None:
    """The class of a module's own launches, or None for a module the table does not name."""
    kind = type(module).__name__
    leaf = path.rsplit(".", 1)[-1]
    if leaf in LINEAR_CLASS:
        return LINEAR_CLASS[leaf]
    if kind.endswith("RMSNorm"):
        return "rmsnorm"
    if kind.endswith("Attention"):
        return "attention"
    if kind.endswith("MLP"):
        return "silu_mul"
    if kind.endswith("DecoderLayer"):
        return "residual_add"
    return None


def refine(cls: str, kernel: str) -> str:
    """A kernel's class from its range's class and its own name (a module's body launches several kinds)."""
    for key, named in TRITON_CLASS:
        if key in kernel:
            return named
    if cls == "attention" and "index_put" in kernel:      # the torch path's K/V write
        return "kv_write"
    if GEMM_NAME.search(kernel):
        return {"attention": "qkv_proj", "silu_mul": "gate_up_proj"}.get(cls, cls)
    return cls


class Ranges:
    """Forward hooks that put every named module's calls in a profiler range ``kvcm_step::<class>``."""

    def __init__(self, model):
        self.handles, self.open = [], []
        for path, m in model.named_modules():
            cls = module_class(path, m)
            if cls is None:
                continue
            self.handles.append(m.register_forward_pre_hook(self._enter(cls)))
            self.handles.append(m.register_forward_hook(self._exit))

    def _enter(self, cls):
        def hook(module, args):
            rf = torch.profiler.record_function(PREFIX + cls)
            rf.__enter__()
            self.open.append(rf)
        return hook

    def _exit(self, module, args, out):
        self.open.pop().__exit__(None, None, None)

    def remove(self):
        for h in self.handles:
            h.remove()


@dataclass
class Row:
    """One kernel name of one class: launches and time over the profiled steps."""
    cls: str
    name: str
    count: int = 0
    total_us: float = 0.0


@dataclass
class Table:
    steps: int                               # steps profiled: counts and times are divided by it
    rows: dict = field(default_factory=dict)     # (class, kernel name) -> Row
    order: list = field(default_factory=list)    # (class, kernel name) of one step's kernels, in launch order
    links: dict = field(default_factory=dict)    # CUDA: kernels by how their launch was found (``launch_times``)

    def add(self, cls: str, name: str, us: float) -> None:
        row = self.rows.setdefault((cls, name), Row(cls, name))
        row.count += 1
        row.total_us += us

    def by_class(self) -> dict[str, float]:
        """Time per step of each class, in microseconds."""
        out: dict[str, float] = {}
        for r in self.rows.values():
            out[r.cls] = out.get(r.cls, 0.0) + r.total_us / self.steps
        return out

    @property
    def total_us(self) -> float:
        return sum(r.total_us for r in self.rows.values()) / self.steps

    @property
    def kernels(self) -> float:
        return sum(r.count for r in self.rows.values()) / self.steps


def _innermost(ranges: list[tuple[float, float, str]], t: float) -> str:
    """The class of the innermost range open at host time ``t`` (ranges nest; the latest start is innermost)."""
    best, best_start = "glue", float("-inf")
    for start, end, cls in ranges:
        if start <= t <= end and start >= best_start:
            best, best_start = cls, start
    return best


def _device_events(events) -> list:
    """The device's kernels, copies and sets in start order (not the ranges' own GPU-side annotations)."""
    return sorted((e for e in events if e.device_type == torch.autograd.DeviceType.CUDA
                   and not e.name.startswith(PREFIX)), key=lambda e: e.time_range.start)


def launch_times(events, kernels) -> tuple[list[float | None], list[str]]:
    """The host time each kernel was launched at (None where nothing says), and how it was found: ``op``,
    ``launch call``, ``launch order`` or ``none``.

    The profiler links a kernel to the host op that launched it through correlation ids. A kernel that cuBLAS
    launches through the CUDA driver (``cuLaunchKernelEx``: the ``nvjet_*`` GEMMs of recent cuBLAS on Hopper)
    can come without that link: an H100 profile of the fused layers filed every projection GEMM as glue. Two
    fallbacks then, in turn: the launch call itself (the runtime or driver event of the kernel's own correlation
    id: launched from inside the op, so inside its range); else launch order: a GEMM host op that no kernel is linked
    to (``aten::mm``, ``addmm``...) is matched to the unlinked kernels between the same two linked neighbours, in
    order (kernels of one stream run in the order they were launched), the last op taking any extra kernel (a
    split-K reduction)."""
    cpu = torch.autograd.DeviceType.CPU
    frontend = {e.id: e for e in events if e.device_type == cpu and not getattr(e, "linked_correlation_id", 0)}
    calls = {e.id: e for e in events if e.device_type == cpu and LAUNCH_API.match(e.name)}
    linked = {getattr(k, "linked_correlation_id", 0) for k in kernels}
    times: list[float | None] = []
    how: list[str] = []
    for k in kernels:
        op = frontend.get(getattr(k, "linked_correlation_id", 0))
        call = calls.get(k.id) if op is None else None
        times.append(op.time_range.start if op is not None else call.time_range.start if call is not None else None)
        how.append("op" if op is not None else "launch call" if call is not None else "none")
    orphans = sorted((e.time_range.start for e in frontend.values() if GEMM_OP.match(e.name) and e.id not in linked))
    i = 0
    while i < len(times):
        if times[i] is not None:
            i += 1
            continue
        j = i
        while j < len(times) and times[j] is None:
            j += 1
        low = next((t for t in reversed(times[:i]) if t is not None), float("-inf"))
        high = times[j] if j < len(times) else float("inf")
        ops = [t for t in orphans if low < t < high]
        if ops:
            for n in range(i, j):
                times[n], how[n] = ops[min(n - i, len(ops) - 1)], "launch order"
        i = j
    return times, how


def attribute(prof, steps: int, cuda: bool) -> Table:
    """The profiled steps' kernels (CUDA) or aten ops by self time (CPU), each with its class."""
    events = list(prof.events())
    # host ranges only: the GPU-side copies of the ranges (same names) are in device time
    ranges = [(e.time_range.start, e.time_range.end, e.name[len(PREFIX):]) for e in events
              if e.name.startswith(PREFIX) and e.device_type == torch.autograd.DeviceType.CPU]
    table = Table(steps)
    if cuda:
        kernels = _device_events(events)
        times, how = launch_times(events, kernels)
        for found in how:
            table.links[found] = table.links.get(found, 0) + 1
        for k, t in zip(kernels, times):
            cls = refine(_innermost(ranges, t) if t is not None else "glue", k.name)
            table.add(cls, k.name, k.time_range.elapsed_us())
            table.order.append((cls, k.name))
    else:
        ops = sorted((e for e in events if e.device_type == torch.autograd.DeviceType.CPU
                      and not e.name.startswith(PREFIX) and e.self_cpu_time_total > 0),
                     key=lambda e: e.time_range.start)
        for op in ops:
            cls = refine(_innermost(ranges, op.time_range.start), op.name)
            table.add(cls, op.name, op.self_cpu_time_total)
            table.order.append((cls, op.name))
    table.order = table.order[:len(table.order) // steps]
    return table


def profile(step, model, steps: int, cuda: bool) -> Table:
    """``steps`` calls of ``step`` (an eager forward: the hooks' ranges see every module) under the profiler."""
    from torch.profiler import ProfilerActivity
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    step()
    ranges = Ranges(model)
    try:
        if cuda:
            torch.cuda.synchronize()
        with torch.profiler.profile(activities=activities) as prof:
            for _ in range(steps):
                step()
            if cuda:
                torch.cuda.synchronize()
    finally:
        ranges.remove()
    return attribute(prof, steps, cuda)


def graph_kernels(replay, replays: int) -> list[tuple[str, float]] | None:
    """(name, mean us) of each kernel of a CUDA graph's replay, in order, or None if the profiler saw none."""
    from torch.profiler import ProfilerActivity
    replay()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(replays):
            replay()
        torch.cuda.synchronize()
    ks = _device_events(list(prof.events()))
    if not ks or len(ks) % replays:
        return None
    n = len(ks) // replays
    return [(ks[i].name, sum(ks[r * n + i].time_range.elapsed_us() for r in range(replays)) / replays)
            for i in range(n)]


def with_graph_times(eager: Table, graph: list[tuple[str, float]] | None) -> tuple[Table, bool]:
    """The eager table's classes with the graph replay's kernel times, when the replay ran the same kernels in
    the same order (each replayed kernel takes the class of the eager kernel at its place); else the eager table
    as it is, and False."""
    if graph is None or [n for n, _ in graph] != [n for _, n in eager.order]:
        return eager, False
    out = Table(1, order=list(eager.order))
    for (cls, _), (name, us) in zip(eager.order, graph):
        out.add(cls, name, us)
    return out, True
