"""``EngineConfig``: every option of ``LLM`` as one frozen, checked value (nano-vllm's ``Config``).

``LLM(model, **options)`` builds one (or takes ``config=``): the fields are checked here, once and in one style
(``kvcm.ConfigError`` naming field, value and limit), before any page is allocated; what can only be checked
against the model (positions, the kernel's tiles for its heads, a draft model's vocabulary) is
``check_model``. The engine reads the value, never the keywords, so an option is declared, defaulted and checked
in one place. ``max_draft_len`` may be left out when the drafter says it (an ``NgramDrafter``'s ``num_draft``);
given both, they must agree. ``policy`` (a ``kvcm.policy.Policy``): the decisions of every cache, scheduler and
drafter this engine builds; None takes the active one (``kvcm.policy.active()``) when the engine is built.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import ClassVar

import torch

from .. import validation, versions
from ..config import KvCacheConfig
from ..errors import ConfigError
from ..limits import Limits
from ..policy import Policy
from . import checks, spec_cutoff, spec_gate


@dataclass(frozen=True)
class EngineConfig:
    kvcm_version: str = versions.ENGINE_DEFAULT
    kv_cache_config: KvCacheConfig | None = None    # None: ``llm.default_kv_cache_config`` for the model
    max_batch_size: int = 64
    max_seq_len: int = 2048
    max_num_tokens: int | None = None
    device: str | torch.device = "cpu"
    trace: bool = False
    max_draft_len: int | None = None                # None: the drafter's ``num_draft``, else 0
    cuda_graph: bool = False
    cuda_graph_batch_sizes: list[int] | None = None
    cuda_graph_token_buckets: list[int] | None = None
    graph_capture: bool | None = None
    overlap: bool = True
    draft_kvcm_version: str | None = None           # None: ``kvcm_version``
    draft_kv_cache_config: KvCacheConfig | None = None
    enable_block_reuse: bool | None = None          # None: ``kv_cache_config.enable_block_reuse``
    spec_max_concurrency: int | None = spec_cutoff.DEFAULT_SPEC_MAX_CONCURRENCY
    spec_acceptance_window: int = spec_gate.DEFAULT_WINDOW
    spec_acceptance_threshold: float | None = None
    decode_split_len: int = 0
    prefill_block_m: int | None = None
    fused_layers: bool = True                       # the Triton path's fused Llama-family layers (fused_layers.py)
    pipelined_keys: bool = False                    # the attention kernel's key loop software-pipelined
    decode_rows_by_index: bool = True               # a decode step's attention programs take their rows by index
    step_row_map: bool = False                      # other steps' programs read their rows from a map made once
    host_cache_size: int | None = None              # the host tier's bytes (V1, V2); overrides kv_cache_config's
    policy: Policy | None = field(default=None, compare=False)   # None: kvcm.policy.active() at LLM()
    limits: Limits = field(init=False, repr=False, compare=False)   # B, S, N, D and the device, checked

    def __post_init__(self):
        set_ = object.__setattr__.__get__(self)
        set_("limits", Limits(self.max_batch_size, self.max_seq_len, self.max_num_tokens,
                              0 if self.max_draft_len is None else self.max_draft_len, device=self.device))
        for name in ("overlap", "trace", "cuda_graph", "fused_layers", "pipelined_keys", "decode_rows_by_index",
                     "step_row_map"):
            validation.flag(name, getattr(self, name))
        if self.graph_capture is not None:
            validation.flag("graph_capture", self.graph_capture)
        for name in ("cuda_graph_batch_sizes", "cuda_graph_token_buckets"):
            if getattr(self, name) is not None:
                checks.int_list(name, getattr(self, name), low=1)
        tile = checks.triton_attention.TILE_N
        if validation.count("decode_split_len", self.decode_split_len) % tile:
            raise ConfigError("decode_split_len", self.decode_split_len, f"must be 0 (off) or a multiple of {tile} "
                                                                         "(the attention kernel's key tile)")
        if self.prefill_block_m is not None and type(self.prefill_block_m) is not int:
            raise ConfigError("prefill_block_m", self.prefill_block_m, "must be None (the kernel's least tile) or "
                              f"an integer, not {type(self.prefill_block_m).__name__}")
        spec_cutoff.check(self.spec_max_concurrency)
        spec_gate.check_window(self.spec_acceptance_window)
        spec_gate.check_threshold(self.spec_acceptance_threshold)
        if self.policy is not None and not isinstance(self.policy, Policy):
            raise ConfigError("policy", self.policy, "must be a kvcm.policy.Policy or None (the active one)")
        if self.enable_block_reuse is not None and type(self.enable_block_reuse) is not bool:
            raise ConfigError("enable_block_reuse", self.enable_block_reuse, "must be True, False or None")
        for name in ("kv_cache_config", "draft_kv_cache_config"):
            if getattr(getattr(self, name), "async_onboard", False) is True:
                raise ConfigError(f"{name}.async_onboard", True, "must be False in the engine: it brings host-tier "
                                  "hits back within the step (its scheduler never calls complete_transfers)")

    OPTIONS: ClassVar[frozenset[str]]           # the fields a caller gives (all but ``limits``)

    def replace(self, **changes) -> "EngineConfig":
        return dataclasses.replace(self, **changes)

    def with_drafter(self, drafter) -> "EngineConfig":
        """``max_draft_len`` said once: when not given, a drafter object's ``num_draft`` (else 0)."""
        if self.max_draft_len is not None:
            return self
        num_draft = _num_draft(drafter)
        return self.replace(max_draft_len=num_draft if type(num_draft) is int else 0)

    def check_model(self, model, drafter) -> None:
        """What needs the model: ``max_seq_len`` within its positions (past them the rotary tables give garbage,
        silently), the kernel's query tile for its heads, and the drafter against ``max_draft_len``."""
        checks.check_positions("max_seq_len", self.max_seq_len, model)
        checks.check_prefill_block_m(self.prefill_block_m, model)
        checks.check_drafter(drafter, self.max_draft_len, model, self.prefill_block_m)
        num_draft = _num_draft(drafter)
        if drafter is not None and not isinstance(drafter, (str, torch.nn.Module)) and num_draft != self.max_draft_len:
            raise ConfigError("max_draft_len", self.max_draft_len, f"must equal the drafter's num_draft={num_draft!r}")
        if isinstance(drafter, torch.nn.Module):
            checks.check_positions("max_seq_len + max_draft_len", self.max_seq_len + self.max_draft_len, drafter,
                                   "the draft model's")


def _num_draft(drafter):
    """The drafts a step of a drafter object proposes (None for ``"ngram"``, a draft model or no drafter)."""
    return None if drafter is None or isinstance(drafter, (str, torch.nn.Module)) else getattr(
        drafter, "num_draft", None)


EngineConfig.OPTIONS = frozenset(f.name for f in dataclasses.fields(EngineConfig) if f.init)
