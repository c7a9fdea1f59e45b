"""What this machine is: GPUs, memory, SM, CPUs, host — the facts markers and lane conditions test.

Why a module of its own: the ``gpu`` marker (skip what this machine cannot run) and the lane conditions (pick
the tests for this machine) must agree on the same facts, and tests must be able to *pretend* to be another
machine (an 8x H100 box on a CPU laptop) without monkeypatching torch. So the facts are read once into a
plain, frozen :class:`MachineInfo`, either from torch or from a JSON override:

* ``--kvcm-machine=JSON_OR_PATH`` (option), else the environment variable ``KVCM_MACHINE_JSON``: a JSON object
  (inline, or the path of a file holding one), e.g.
  ``{"gpu_count": 8, "gpu_name": "NVIDIA H100 80GB HBM3", "gpu_memory_gb": 85, "sm": 90}``.
  Fields not given mean "nothing": no GPUs, backend ``cpu``; ``hostname``/``cpu_count`` default to the real
  ones. ``keys`` adds extra condition keys (``{"keys": {"rack": "a7"}}``).

Units: memory is in GB = 10**9 bytes, as GPU vendors count it, so an "80 GB" H100 (79.1 GiB) satisfies
``min_memory_gb=80``. ``sm`` is the compute capability as in ``sm_90``: ``major * 10 + minor``.

torch is read lazily (``torch.cuda.device_count()``, ``get_device_properties``), which honours
``CUDA_VISIBLE_DEVICES``; under pytest-xdist the sharding sub-plugin narrows that variable first, so a worker's
:class:`MachineInfo` describes the GPUs *it* sees while ``system_gpu_count`` keeps the host's count (lane
conditions must not differ between workers, or xdist sees different collections).
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
from pathlib import Path
from typing import Any

import pytest

from .lanes.file_format import read_text

from .options import ENV_MACHINE  # noqa: E402  (declared with --kvcm-machine)
#: set by the sharding sub-plugin on an xdist worker: the CUDA_VISIBLE_DEVICES value before narrowing
ENV_HOST_DEVICES = "KVCM_HOST_CUDA_VISIBLE_DEVICES"

_STASH_LOCAL = pytest.StashKey["MachineInfo"]()
_STASH_HOST = pytest.StashKey["MachineInfo"]()


@dataclasses.dataclass(frozen=True)
class MachineInfo:
    """The facts of one process's view of the machine (GPU lists are per visible GPU, in device order)."""

    gpu_names: tuple[str, ...] = ()
    gpu_memory_gb: tuple[float, ...] = ()
    gpu_sm: tuple[int, ...] = ()
    hostname: str = dataclasses.field(default_factory=socket.gethostname)
    cpu_count: int = dataclasses.field(default_factory=lambda: os.cpu_count() or 1)
    system_gpu_count: int | None = None  # GPUs of the host; None = same as gpu_count
    backend: str | None = None  # None = "cuda" with GPUs, else "cpu"
    stage: str = "pre_merge"
    torch_version: str | None = None
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)
    source: str = "torch"  # where the facts came from, for messages

    def __post_init__(self) -> None:
        n = len(self.gpu_names)
        if len(self.gpu_memory_gb) != n or len(self.gpu_sm) != n:
            raise ValueError(
                f"MachineInfo: gpu_names has {n} entries but gpu_memory_gb has {len(self.gpu_memory_gb)} "
                f"and gpu_sm has {len(self.gpu_sm)}; give one value per GPU (or one value for all)"
            )

    @property
    def gpu_count(self) -> int:
        return len(self.gpu_names)

    @property
    def host_gpu_count(self) -> int:
        return self.gpu_count if self.system_gpu_count is None else self.system_gpu_count

    def as_condition_keys(self) -> dict[str, Any]:
        """The keys lane conditions test (docs/semantics.md 9). A machine without GPUs reports ``gpu: "none"`` and
        0 memory / sm, so a GPU lane's conditions fail on it rather than 'not reported, so matching'."""
        keys: dict[str, Any] = {
            "system_gpu_count": self.host_gpu_count,
            "gpu_count": self.gpu_count,
            "gpu": self.gpu_names[0].lower() if self.gpu_names else "none",
            "gpu_memory_gb": min(self.gpu_memory_gb) if self.gpu_memory_gb else 0,
            "sm": min(self.gpu_sm) if self.gpu_sm else 0,
            "stage": self.stage,
            "backend": self.backend or ("cuda" if self.gpu_names else "cpu"),
            "cpu_count": self.cpu_count,
            "hostname": self.hostname,
        }
        if self.torch_version:
            keys["torch"] = self.torch_version
        keys.update(self.extra)
        return keys

    def describe(self) -> str:
        """'0 GPU(s)' or '2 GPU(s): NVIDIA H100 80GB HBM3 (85.0 GB, sm 90) x2'."""
        if not self.gpu_names:
            return "0 GPU(s)"
        groups: list[list[Any]] = []
        for spec in zip(self.gpu_names, self.gpu_memory_gb, self.gpu_sm):
            if groups and groups[-1][0] == spec:
                groups[-1][1] += 1
            else:
                groups.append([spec, 1])
        parts = [f"{n} ({m:.1f} GB, sm {s})" + (f" x{k}" if k > 1 else "") for (n, m, s), k in groups]
        return f"{self.gpu_count} GPU(s): " + ", ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> MachineInfo:
        d = dict(data)
        for k in ("gpu_names", "gpu_memory_gb", "gpu_sm"):
            d[k] = tuple(d.get(k, ()))
        return cls(**d)


_OVERRIDE_FIELDS = {
    "gpu_count", "gpu_name", "gpu_names", "gpu_memory_gb", "sm", "hostname", "cpu_count",
    "system_gpu_count", "backend", "torch", "keys",
}


MAX_GPUS = 1024
"""The most GPUs a simulated machine has: its facts hold one entry a GPU, so ``gpu_count: 1e9`` would stall."""


def from_override(text: str, *, stage: str = "pre_merge", source: str = ENV_MACHINE) -> MachineInfo:
    """Build a simulated machine from a JSON object (inline or a file path); see the module docstring."""
    raw = text.strip()
    if not raw.startswith("{"):
        path = Path(raw)
        if not path.is_file():
            raise pytest.UsageError(f"{source}={raw!r}: neither a JSON object nor an existing file")
        raw = path.read_text()
    try:
        data = json.loads(raw)
    except json.JSONDecodeError as e:
        raise pytest.UsageError(f"{source}: invalid JSON ({e})") from None
    if not isinstance(data, dict):
        raise pytest.UsageError(f"{source}: expected a JSON object, got {type(data).__name__}")
    unknown = sorted(set(data) - _OVERRIDE_FIELDS)
    if unknown:
        raise pytest.UsageError(f"{source}: unknown field(s) {unknown}; known: {sorted(_OVERRIDE_FIELDS)}")

    names = data.get("gpu_names")
    if names is None:
        count = data.get("gpu_count", 0)
        if isinstance(count, bool) or not isinstance(count, int) or not 0 <= count <= MAX_GPUS:
            raise pytest.UsageError(f"{source}: gpu_count={count!r} must be an integer in [0, {MAX_GPUS}] (one host's "
                                    "GPUs; the largest hosts have 72)")
        names = [data.get("gpu_name", "Simulated GPU")] * count
    count = len(names)
    if "gpu_count" in data and int(data["gpu_count"]) != count:
        raise pytest.UsageError(f"{source}: gpu_count={data['gpu_count']} but gpu_names lists {count} GPU(s)")

    def per_gpu(field: str, default: float) -> tuple:
        value = data.get(field, default)
        values = list(value) if isinstance(value, list) else [value] * count
        if len(values) != count:
            raise pytest.UsageError(f"{source}: {field} lists {len(values)} value(s) for {count} GPU(s)")
        return tuple(values)

    extra = data.get("keys", {})
    if not isinstance(extra, dict):
        raise pytest.UsageError(f"{source}: keys must be an object, got {extra!r}")
    kwargs: dict[str, Any] = {}
    for field in ("hostname", "cpu_count", "system_gpu_count", "backend"):
        if field in data:
            kwargs[field] = data[field]
    return MachineInfo(
        gpu_names=tuple(str(n) for n in names),
        gpu_memory_gb=tuple(float(m) for m in per_gpu("gpu_memory_gb", 0.0)),
        gpu_sm=tuple(int(s) for s in per_gpu("sm", 0)),
        torch_version=data.get("torch"),
        extra=dict(extra),
        stage=stage,
        source=source,
        **kwargs,
    )


def detect(*, stage: str = "pre_merge") -> MachineInfo:
    """Read this process's GPUs with torch (honours CUDA_VISIBLE_DEVICES). No CUDA build / driver: 0 GPUs."""
    import torch

    names: list[str] = []
    memory: list[float] = []
    sm: list[int] = []
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            p = torch.cuda.get_device_properties(i)
            names.append(p.name)
            memory.append(round(p.total_memory / 1e9, 1))
            sm.append(p.major * 10 + p.minor)
    host = os.environ.get(ENV_HOST_DEVICES)
    system = len([d for d in host.split(",") if d.strip()]) if host is not None else None
    return MachineInfo(
        gpu_names=tuple(names), gpu_memory_gb=tuple(memory), gpu_sm=tuple(sm),
        system_gpu_count=system, stage=stage, source="torch",
        torch_version=".".join(torch.__version__.split("+")[0].split(".")[:2]),
    )


def override_text(config: pytest.Config) -> tuple[str, str] | None:
    """The simulated machine's text and where it came from (option or environment), or None when none is given."""
    opt = config.getoption("kvcm_machine", None)
    if opt:
        return opt, "--kvcm-machine"
    env = os.environ.get(ENV_MACHINE)
    if env:
        return env, ENV_MACHINE
    return None


def machine_for(config: pytest.Config) -> MachineInfo:
    """This process's machine (cached per config): the override if one is given, else torch."""
    if _STASH_LOCAL not in config.stash:
        stage = config.getoption("kvcm_stage", None) or "pre_merge"
        override = override_text(config)
        info = from_override(override[0], stage=stage, source=override[1]) if override else detect(stage=stage)
        config.stash[_STASH_LOCAL] = info
    return config.stash[_STASH_LOCAL]


def host_machine_for(config: pytest.Config) -> MachineInfo:
    """The machine lane conditions test. On an xdist worker it is the controller's view, sent through
    ``workerinput`` (see lanes/selection.py), so every worker selects the same tests whatever GPUs it was given."""
    if _STASH_HOST not in config.stash:
        sent = getattr(config, "workerinput", {}).get("kvcm_machine")
        config.stash[_STASH_HOST] = MachineInfo.from_dict(sent) if sent else machine_for(config)
    return config.stash[_STASH_HOST]


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    """A simulated machine (``--kvcm-machine`` / the environment) checked when pytest starts, before a lane
    condition first reads it."""
    override = override_text(config)
    if override is None:
        return
    text, source = override
    if not text.strip().startswith("{") and Path(text.strip()).is_file():
        read_text(Path(text.strip()), f"{source}={text.strip()}")  # not UTF-8: a usage error naming the file
    try:
        from_override(text, source=source)
    except (ValueError, TypeError) as e:
        raise pytest.UsageError(f"{source}={text.strip()!r}: {e}") from None
