"""The step breakdown benchmark (``benchmarks/step_breakdown.py``) in its CPU smoke form: a tiny seeded model,
the CPU profiler, its table adding up. The GPU figures come from the same code (docs/benchmarks.md)."""
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import step_breakdown  # noqa: E402
from kvcm.models import tiny_model  # noqa: E402

ARGS = ["--model", "tiny", "--device", "cpu", "--batch", "4", "--prompt-len", "12", "--decode-new", "8",
        "--mixed-tokens", "16", "--mixed-new", "8", "--reps", "1"]
# every class a llama layer has on the torch path (its rotary too: the cos/sin module and their products)
CLASSES = {"embedding", "rmsnorm", "qkv_proj", "rotary", "kv_write", "attention", "o_proj", "residual_add",
           "gate_up_proj", "silu_mul", "down_proj", "lm_head", "sampler", "glue"}


@pytest.fixture(scope="module")
def table():
    return step_breakdown.main(ARGS)


def test_both_steps_are_the_ones_asked_for(table):
    d, m = table["decode"]["step"], table["mixed"]["step"]
    assert (d["rows"], d["decodes"], d["tokens"], d["kv_mean"], d["kv_max"]) == (4, 4, 4, 19, 19)
    assert m["decodes"] > 0 and m["prefill_tokens"] > 0 and m["tokens"] == 16


@pytest.mark.parametrize("step", ["decode", "mixed"])
def test_the_table_adds_up(table, step):
    b = table[step]
    rows = {r["class"]: r for r in b["rows"]}
    assert {c for c, r in rows.items() if r["us"] > 0} == CLASSES       # every op landed in a class it has
    assert sum(r["us"] for r in b["rows"]) == pytest.approx(b["kernel_us"])
    assert sum(k["us"] for r in b["rows"] for k in r["kernels"]) == pytest.approx(b["kernel_us"])
    assert sum(k["count"] for r in b["rows"] for k in r["kernels"]) == pytest.approx(b["kernels_per_step"])
    assert sum(r["bytes"] for r in b["rows"]) == b["class_bytes"] > b["bound_bytes"]
    for r in b["rows"]:
        assert r["gbps"] == pytest.approx(r["bytes"] / (r["us"] * 1e3))
    seconds = b["kernel_us"] * 1e-6                     # no graph on the CPU: the step is its ops' time
    assert b["efficiency"] == pytest.approx(b["bound_bytes"] / (seconds * b["peak_gbps"] * 1e9))


def test_the_bound_is_the_weights_and_the_kv(table):
    """The bound's weight bytes are the model's parameters (tied embeddings once), its KV the rows' lengths."""
    model, _ = tiny_model("llama", seed=0)
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    cfg = model.config
    kv_token = cfg.num_hidden_layers * 2 * cfg.num_key_value_heads * cfg.head_dim * 4
    d = table["decode"]
    assert d["bound_bytes"] == weights + kv_token * (4 * 19 + 4)     # 4 rows read 19 keys, write 1 each
    assert torch.finfo(model.dtype).bits == 32


def test_a_graph_replay_takes_the_eager_classes_only_when_its_kernels_match():
    """On CUDA the table takes the graph replay's kernel times, each kernel the class of the eager kernel at its
    place; a replay that ran other kernels (or none seen) leaves the eager table."""
    import _kernel_table as kt
    eager = kt.Table(2)
    for _ in range(2):
        for cls, name, us in (("rmsnorm", "norm_k", 4.0), ("qkv_proj", "gemm_a", 6.0), ("o_proj", "gemm_a", 8.0)):
            eager.add(cls, name, us)
    eager.order = [("rmsnorm", "norm_k"), ("qkv_proj", "gemm_a"), ("o_proj", "gemm_a")]
    graph, used = kt.with_graph_times(eager, [("norm_k", 1.0), ("gemm_a", 2.0), ("gemm_a", 3.0)])
    assert used and graph.by_class() == {"rmsnorm": 1.0, "qkv_proj": 2.0, "o_proj": 3.0}
    assert eager.by_class() == {"rmsnorm": 4.0, "qkv_proj": 6.0, "o_proj": 8.0}
    for other in (None, [("norm_k", 1.0), ("gemm_b", 2.0), ("gemm_a", 3.0)], [("norm_k", 1.0)]):
        assert kt.with_graph_times(eager, other) == (eager, False)


def test_cuda_kernels_take_the_class_of_the_range_their_launching_op_was_in():
    """The CUDA side of the attribution, on hand-made profiler events: a kernel is linked to the host op that
    launched it, and that op's time falls in a range; a kernel with no linked op keeps what its name says (a
    Triton kernel) or is glue; the ranges' own GPU-side annotations are not kernels."""
    from types import SimpleNamespace

    import _kernel_table as kt
    from torch.autograd import DeviceType
    from torch.autograd.profiler_util import Interval

    def ev(name, device, start, end, id_=0, linked=0):
        return SimpleNamespace(name=name, device_type=device, id=id_, linked_correlation_id=linked,
                               time_range=Interval(start, end), self_cpu_time_total=end - start)
    cpu, gpu = DeviceType.CPU, DeviceType.CUDA
    events = [ev("kvcm_step::attention", cpu, 0, 50, 1), ev("kvcm_step::qkv_proj", cpu, 10, 20, 2),
              ev("aten::mm", cpu, 12, 14, 3), ev("aten::add", cpu, 30, 31, 4),
              ev("cudaLaunchKernel", cpu, 12.5, 13, 500, linked=3),         # runtime event: not a frontend op
              ev("gemm_kernel", gpu, 100, 106, 500, linked=3), ev("kvcm_step::qkv_proj", gpu, 99, 107, 0, 2),
              ev("elementwise_kernel", gpu, 107, 109, 501, linked=4),
              ev("_paged_attention_kernel", gpu, 110, 130, 502, linked=77), ev("memset", gpu, 131, 132, 503)]
    table = kt.attribute(SimpleNamespace(events=lambda: events), 1, cuda=True)
    assert table.order == [("qkv_proj", "gemm_kernel"), ("attention", "elementwise_kernel"),
                           ("attention", "_paged_attention_kernel"), ("glue", "memset")]
    assert table.by_class() == {"qkv_proj": 6, "attention": 22, "glue": 1}


def test_kernels_without_a_linked_op_take_the_class_of_their_launch():
    """cuBLAS launches its ``nvjet`` GEMMs through the driver, and the profiler may not link such a kernel to its
    op (an H100 profile filed every projection of the fused layers as glue). Such a kernel takes the class of its
    own launch call when the profiler recorded one, else of the GEMM op no kernel is linked to between the same
    linked neighbours (a split-K pair both), else glue; and the ranges' GPU-side copies, in device time, never
    decide a class."""
    from types import SimpleNamespace

    import _kernel_table as kt
    from torch.autograd import DeviceType
    from torch.autograd.profiler_util import Interval

    def ev(name, device, start, end, id_=0, linked=0):
        return SimpleNamespace(name=name, device_type=device, id=id_, linked_correlation_id=linked,
                               time_range=Interval(start, end), self_cpu_time_total=end - start)
    cpu, gpu = DeviceType.CPU, DeviceType.CUDA
    ranges = [ev(f"kvcm_step::{c}", cpu, a, b, 90 + i) for i, (c, a, b) in
              enumerate([("qkv_proj", 10, 20), ("attention", 22, 28), ("o_proj", 30, 40), ("down_proj", 50, 60),
                         ("sampler", 70, 80)])]
    host = [ev("aten::mm", cpu, 12, 14, 3), ev("cuLaunchKernelEx", cpu, 13, 13.5, 600),    # a launch call, unlinked
            ev("aten::add", cpu, 25, 26, 4), ev("aten::mm", cpu, 32, 34, 5), ev("aten::add", cpu, 45, 46, 6),
            ev("aten::addmm", cpu, 52, 55, 7), ev("aten::max", cpu, 72, 73, 8),
            ev("kvcm_step::rmsnorm", gpu, 31, 33, 0)]             # a range's GPU-side copy, over the o_proj op
    kernels = [("nvjet_tst_a", 600, 0), ("elementwise_kernel", 601, 4), ("nvjet_tst_b", 602, 0),
               ("vectorized_add", 603, 6), ("nvjet_tst_c", 604, 0), ("splitKreduce_kernel", 605, 0),
               ("reduce_kernel", 606, 8), ("memset", 607, 0)]
    events = ranges + host + [ev(name, gpu, 100 + 2 * i, 101 + 2 * i, id_, linked)
                              for i, (name, id_, linked) in enumerate(kernels)]
    table = kt.attribute(SimpleNamespace(events=lambda: events), 1, cuda=True)
    assert table.order == [("qkv_proj", "nvjet_tst_a"), ("attention", "elementwise_kernel"),
                           ("o_proj", "nvjet_tst_b"), ("glue", "vectorized_add"), ("down_proj", "nvjet_tst_c"),
                           ("down_proj", "splitKreduce_kernel"), ("sampler", "reduce_kernel"), ("glue", "memset")]
    assert table.links == {"op": 3, "launch call": 1, "launch order": 3, "none": 1}
