"""One model's KV cache for the engine, built one way with or without CUDA graphs (target and draft alike).

Without graphs: the final manager from the config, and its runner. With a :class:`cuda_graph.GraphPlan` (and no
ready manager), first the estimation cache, warmed up eagerly and released (``kvcm.estimation.estimate``), then
the final manager from the config the estimation leaves (``kvcm.estimation.final_cache_config``), its runner and its
graphs. Kept apart from ``cuda_graph.py`` so a cache without graphs does not depend on graph code.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..estimation import engine_estimation_config, estimate, final_cache_config
from .attention import KernelOptions
from .cuda_graph import GraphPlan, StepGraphs, setup_cuda_graphs, warm_eagerly
from .runner import ModelRunner


@dataclass
class EngineCache:
    """What :func:`build_cache` hands back: the final manager, its runner, its graphs and every warmup report
    (estimation, then final)."""
    manager: object
    runner: ModelRunner
    graphs: StepGraphs | None
    reports: list


def build_cache(model, device, make_manager, kv_cache_config, plan: GraphPlan | None, *, max_seq_len: int,
                manager=None, tracer=None, kernel: KernelOptions = KernelOptions(), policy=None) -> EngineCache:
    """``make_manager(config)`` builds a manager; ``manager``, when given, is used as it is (no estimation).
    ``policy``: the engine's (None: the active one), for the estimation config and the final one."""
    reports, described = [], None
    if plan is not None and manager is None:
        est_cfg = engine_estimation_config(kv_cache_config, max_seq_len, device, policy)
        described, report = estimate(make_manager, est_cfg, warm=warm_eagerly(model, device, plan))
        reports.append(report)
    if manager is None:
        manager = make_manager(final_cache_config(kv_cache_config, described, reports[0] if reports else None, policy))
    runner = ModelRunner(model, manager, device, tracer, kernel)
    graphs = None
    if plan is not None:
        graphs, final = setup_cuda_graphs(runner, plan)
        reports += final
    return EngineCache(manager, runner, graphs, reports)
