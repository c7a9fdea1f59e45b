"""The project's markers, and skipping what this machine cannot run.

Markers (all registered, so ``--strict-markers`` is clean):

* ``gpu(count=1, min_memory_gb=None, min_sm=None)`` — needs ``count`` visible GPUs; each of the first
  ``count`` must have at least ``min_memory_gb`` GB (10**9 bytes) and at least ``min_sm`` (e.g. 90 for
  compute capability 9.0). Otherwise the test is *skipped* with a reason naming what it needs and what the
  machine has: "needs 2 GPU(s) with >= 80 GB, sm >= 90; this machine has 0 GPU(s)". Skipped, not failed: a
  CPU runner is not broken because it has no H100; the lane files decide which machines must run GPU tests.
* ``cpu_only`` — runs on the CPU whatever the machine; ``--kvcm-gpu-only`` skips these (for a GPU runner that
  only should spend its time on GPU tests).
* ``accuracy`` — a label for ``-m`` selection (the accuracy sub-plugin gives it meaning).
* ``slow`` — minutes each on a CPU (the SmolLM2 model gates). Skipped by default, with a reason, so a
  newcomer's first ``pytest`` finishes in minutes; ``--kvcm-slow`` (ini ``kvcm_slow = true``) runs them, and
  so does any ``-m`` expression that names ``slow`` (``-m slow`` runs only them). A lane entry is not an
  opt-in: CI runs the slow tests as their own invocation.
* ``exhaustive`` — the bounded exhaustive explorer of the managers (``suites/managers/exhaustive``): in both stages,
  at its quick budget pre-merge and its full one post-merge (``exhaustive_scale``); its deep configurations are
  also marked ``slow``.
* ``post_merge`` — deep work that belongs to the post-merge stage (``lanes/merge_stage.py``).
* ``kvcm_versions(*versions)`` — registered here; the versions sub-plugin implements it.

The machine facts come from :mod:`pytest_kvcm.machine` (``--kvcm-machine`` simulates another machine).
"""

from __future__ import annotations

import math
import os

import pytest

from pytest_kvcm.machine import ENV_MACHINE, MachineInfo, machine_for
from pytest_kvcm.options import EXHAUSTIVE_QUICK_SCALE

MARKERS = [
    "gpu(count=1, min_memory_gb=None, min_sm=None): needs `count` visible GPUs with at least `min_memory_gb` "
    "GB (10**9 bytes) and compute capability `min_sm` (e.g. 90); skipped on machines without them",
    "cpu_only: runs on the CPU on every machine; skipped by --kvcm-gpu-only",
    "accuracy: an accuracy gate (model outputs scored against a reference)",
    "slow: takes more than a few seconds on a CPU",
    "post_merge: deep work that belongs to the post-merge lane, not the five-minute pre-merge run",
    "exhaustive: the bounded exhaustive explorer of the managers (suites/managers/exhaustive; in the default run, "
    "its deep configurations also marked slow)",
    "kvcm_versions(*versions): restrict a kvcm_version-parametrized test to these manager versions",
]

_GPU_ARGS = ("count", "min_memory_gb", "min_sm")


def pytest_configure(config: pytest.Config) -> None:
    for line in MARKERS:
        config.addinivalue_line("markers", line)
    scale = config.getoption("kvcm_exhaustive_scale", None)
    if scale is not None and not (math.isfinite(scale) and scale > 0):
        raise pytest.UsageError(f"--kvcm-exhaustive-scale={scale}: must be a finite number > 0 (1 is the post-merge "
                                f"budget, {EXHAUSTIVE_QUICK_SCALE} the pre-merge one)")


def exhaustive_scale(config: pytest.Config) -> float:
    """The explorer's budget factor: the option, else the stage's (the quick form pre-merge, 1 post-merge)."""
    scale = config.getoption("kvcm_exhaustive_scale", None)
    if scale is not None:
        return scale
    return 1.0 if (config.getoption("kvcm_stage", None) or "pre_merge") == "post_merge" else EXHAUSTIVE_QUICK_SCALE


def gpu_requirement(mark: pytest.Mark, where: str) -> tuple[int, float | None, int | None]:
    """(count, min_memory_gb, min_sm) of a ``gpu`` mark; a bad argument is a usage error naming it."""
    if len(mark.args) > 1:
        raise pytest.UsageError(f"{where}: gpu() takes at most one positional argument (count), given {mark.args}")
    kwargs = dict(mark.kwargs)
    if mark.args:
        if "count" in kwargs:
            raise pytest.UsageError(f"{where}: gpu() got count both as positional and keyword")
        kwargs["count"] = mark.args[0]
    unknown = sorted(set(kwargs) - set(_GPU_ARGS))
    if unknown:
        raise pytest.UsageError(f"{where}: gpu() got unknown argument(s) {unknown}; known: {list(_GPU_ARGS)}")
    count = kwargs.get("count", 1)
    if not isinstance(count, int) or isinstance(count, bool) or count < 1:
        raise pytest.UsageError(f"{where}: gpu(count={count!r}): count must be an integer >= 1")
    mem = kwargs.get("min_memory_gb")
    if mem is not None and (not isinstance(mem, (int, float)) or isinstance(mem, bool) or mem <= 0):
        raise pytest.UsageError(f"{where}: gpu(min_memory_gb={mem!r}): must be a number of GB > 0")
    sm = kwargs.get("min_sm")
    if sm is not None and (not isinstance(sm, int) or isinstance(sm, bool) or sm < 10):
        raise pytest.UsageError(
            f"{where}: gpu(min_sm={sm!r}): min_sm is an sm number such as 90 (compute capability 9.0) or 89 (8.9)"
        )
    return count, mem, sm


def describe_need(count: int, mem: float | None, sm: int | None) -> str:
    need = [f"with >= {mem:g} GB"] if mem is not None else []
    if sm is not None:
        need.append(f"sm >= {sm}")
    return f"needs {count} GPU(s)" + (" " + ", ".join(need) if need else "")


def unmet_reason(machine: MachineInfo, count: int, mem: float | None, sm: int | None) -> str | None:
    """None when the first ``count`` visible GPUs satisfy the need, else the skip reason."""
    ok = machine.gpu_count >= count and all(
        (mem is None or m >= mem) and (sm is None or s >= sm)
        for m, s in list(zip(machine.gpu_memory_gb, machine.gpu_sm))[:count]
    )
    if ok:
        return None
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    who = f"this worker ({worker}, CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', '')!r})" \
        if worker and machine.source == "torch" else "this machine"
    return f"{describe_need(count, mem, sm)}; {who} has {machine.describe()}"


SLOW_SKIP = "slow test (minutes on a CPU): skipped by default; --kvcm-slow or -m slow runs it"


def run_slow(config: pytest.Config) -> bool:
    """Whether tests marked ``slow`` run: asked for by option, ini, or a ``-m`` expression naming ``slow``."""
    opt = config.getoption("kvcm_slow")
    if opt is not None:
        return opt
    if (config.getoption("kvcm_stage", None) or "pre_merge") == "post_merge":   # where slow tests run
        return True
    if "slow" in (config.getoption("markexpr", "") or ""):
        return True
    return bool(config.getini("kvcm_slow"))


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    gpu_only = config.getoption("kvcm_gpu_only")
    slow = run_slow(config)
    machine = None  # detected only if some selected test asks for a GPU (reading torch.cuda costs time)
    for item in items:
        if gpu_only and item.get_closest_marker("cpu_only") is not None:
            item.add_marker(pytest.mark.skip(reason="cpu_only test; --kvcm-gpu-only skips cpu_only tests"))
        if not slow and item.get_closest_marker("slow") is not None:
            item.add_marker(pytest.mark.skip(reason=SLOW_SKIP))
            continue
        mark = item.get_closest_marker("gpu")
        if mark is None:
            continue
        need = gpu_requirement(mark, item.nodeid)
        machine = machine or machine_for(config)
        reason = unmet_reason(machine, *need)
        if reason:
            item.add_marker(pytest.mark.skip(reason=reason))


def pytest_report_header(config: pytest.Config) -> list[str]:
    stage = config.getoption("kvcm_stage", None) or "pre_merge"
    staged = stage in ("pre_merge", "post_merge")      # lanes/merge_stage.py says what those stages deselect
    lines = [] if run_slow(config) or staged else ["kvcm: tests marked slow are skipped; --kvcm-slow runs them"]
    if config.getoption("kvcm_machine") or os.environ.get(ENV_MACHINE):
        m = machine_for(config)
        lines.append(f"kvcm machine (simulated by {m.source}): {m.describe()}, {m.cpu_count} CPU(s)")
    return lines
