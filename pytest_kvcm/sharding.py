"""One GPU slice per pytest-xdist worker, through ``CUDA_VISIBLE_DEVICES``.

``pytest -n 8 --kvcm-gpus-per-worker=1`` on an 8-GPU host gives worker ``gwN`` the devices
``[N*g, (N+1)*g)`` of the devices visible to the controller (g = ``--kvcm-gpus-per-worker``, ini
``kvcm_gpus_per_worker``, default 1; 0 leaves every worker with all GPUs). Without this, every worker's
``cuda:0`` is the same GPU and eight workers fight over its memory.

Why ``pytest_load_initial_conftests``: the variable only has effect if it is set before the CUDA runtime starts
in the process, i.e. before anything (a conftest at import, a fixture) calls ``torch.cuda``. That hook runs on
the worker after the plugins are loaded and before any conftest is imported; ``pytest_configure`` repeats it
for plugins loaded late, once (``KVCM_SHARDED`` marks it done).

Choices, written down:

* The visible devices are ``CUDA_VISIBLE_DEVICES`` if set (its entries, indices or UUIDs, are kept as
  written), else ``nvidia-smi -L``'s count; torch is not asked, because asking it starts the CUDA runtime.
  No GPUs: nothing is changed.
* More workers than slices (``-n 4`` on 2 GPUs, or a restarted worker with a higher ``gwN``): the slices wrap
  around (gw2 gets device 0 again) instead of leaving a worker with none, so which worker runs a GPU test never
  decides whether it is skipped. Fewer devices than g: the worker gets all of them, and ``gpu(count=g)`` tests
  skip with a reason that names the worker's devices.
* The host's list is kept in ``KVCM_HOST_CUDA_VISIBLE_DEVICES`` so the machine facts still know
  ``system_gpu_count``.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess

import pytest

from pytest_kvcm.machine import ENV_HOST_DEVICES

ENV_DONE = "KVCM_SHARDED"



def worker_index(worker_id: str | None) -> int | None:
    """'gw3' -> 3; None/'master' -> None."""
    m = re.fullmatch(r"gw(\d+)", worker_id or "")
    return int(m.group(1)) if m else None


def worker_devices(index: int, gpus_per_worker: int, visible: list[str]) -> list[str]:
    """The devices of worker ``index``: ``visible[index*g:(index+1)*g]``, wrapping around when the workers
    outnumber the slices, and all of them when fewer than ``g`` are visible."""
    if gpus_per_worker < 0:
        raise ValueError(f"gpus_per_worker must be >= 0, given {gpus_per_worker}")
    n = len(visible)
    if gpus_per_worker == 0 or n == 0:
        return list(visible)
    if gpus_per_worker >= n:
        return list(visible)
    start = index * gpus_per_worker
    return [visible[(start + i) % n] for i in range(gpus_per_worker)]


def visible_devices(env: dict[str, str] | os._Environ = os.environ) -> list[str]:
    """The devices this process could use, without starting CUDA."""
    value = env.get("CUDA_VISIBLE_DEVICES")
    if value is not None:
        return [d.strip() for d in value.split(",") if d.strip()]
    smi = shutil.which("nvidia-smi")
    if not smi:
        return []
    try:
        out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [str(i) for i, line in enumerate(row for row in out.splitlines() if row.startswith("GPU "))]


def gpus_per_worker(config: pytest.Config, namespace=None) -> int:
    value = getattr(namespace or config.option, "kvcm_gpus_per_worker", None)
    if value is None:
        raw = config.getini("kvcm_gpus_per_worker")
        try:
            value = int(raw)
        except ValueError:
            raise pytest.UsageError(f"ini kvcm_gpus_per_worker={raw!r}: must be an integer >= 0") from None
    if value < 0:
        raise pytest.UsageError(f"--kvcm-gpus-per-worker={value}: must be >= 0 (0 disables sharding)")
    return value


def shard(config: pytest.Config, namespace=None) -> None:
    """On an xdist worker, narrow CUDA_VISIBLE_DEVICES to this worker's slice (once)."""
    index = worker_index(os.environ.get("PYTEST_XDIST_WORKER"))
    if index is None or os.environ.get(ENV_DONE):
        return
    g = gpus_per_worker(config, namespace)
    visible = visible_devices()
    os.environ[ENV_DONE] = "1"
    if g == 0 or not visible:
        return
    os.environ[ENV_HOST_DEVICES] = ",".join(visible)
    os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(worker_devices(index, g, visible))


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(early_config: pytest.Config, parser, args) -> None:
    shard(early_config, early_config.known_args_namespace)


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    gpus_per_worker(config)     # a bad option or ini value stops the run when pytest starts, worker or not
    shard(config)


def plan(workers: int, g: int, visible: list[str]) -> str:
    """'gw0=0,1 gw1=2,3' — what each worker will get."""
    return " ".join(f"gw{i}={','.join(worker_devices(i, g, visible)) or '-'}" for i in range(workers))


def pytest_report_header(config: pytest.Config) -> str | None:
    workers = getattr(config.option, "numprocesses", None)
    if not isinstance(workers, int) or workers <= 0 or hasattr(config, "workerinput"):
        return None
    g = gpus_per_worker(config)
    visible = visible_devices()
    if g == 0:
        return f"kvcm sharding: off (--kvcm-gpus-per-worker=0); {workers} worker(s) share {len(visible)} GPU(s)"
    if not visible:
        return f"kvcm sharding: no visible GPU(s); {workers} worker(s) run without CUDA_VISIBLE_DEVICES changes"
    shared = " (slices wrap around: workers share GPUs)" if workers * g > len(visible) else ""
    return (f"kvcm sharding: {g} GPU(s) per worker, {workers} worker(s) over {len(visible)} visible GPU(s)"
            f"{shared}: {plan(workers, g, visible)}")
