"""What V1 and V2 share: layer groups, page pools, the request table, block tables and the page views.

A subclass decides how many blocks each pool gets (``_size_pools``) and how a request grows; everything here
is bookkeeping that must be identical for both so that tests can compare them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import torch

from .config import BatchDesc, KvCacheConfig
from . import user_rules, validation
from .errors import ConfigError, OutOfPagesError, UnknownRequestError
from .deprecation import renamed_attribute
from .layer_groups import LayerGroup, build_layer_groups
from .limits import MAX_BATCH_SIZE, Limits  # noqa: F401  (MAX_BATCH_SIZE: kvcm.MAX_BATCH_SIZE)
from .model_spec import ModelSpec
from .dummies import DummiesMixin, DummyRequest  # noqa: F401  (DummyRequest: kvcm.DummyRequest)
from .events.api import EventsMixin
from .reuse.api import ReuseMixin
from .parallel import Mapping
from .policy import Decisions, resolve as resolve_policy, rule
from . import versions


@dataclass(slots=True)
class _Sequence:
    capacity: int = 0
    history: int = 0
    blocks: list[list[int]] = field(default_factory=list)  # per group: physical id per logical block, -1 = released
    stale_done: list[int] = field(default_factory=list)  # per group: stale blocks below this are released
    reserved_draft: int = 0  # V1: draft slots reserved by the current generation step
    reuse: object = None  # a kvcm.reuse.state.ReuseState for a request made with its token ids (add_sequence)


def _free_memory(device: torch.device, given: int | None) -> int | None:
    if given is not None:
        return int(given)
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    if device.type == "cpu":
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    return None


class BaseKVCacheManager(DummiesMixin, ReuseMixin, EventsMixin):
    version = renamed_attribute("kvcm_version")

    @property
    def kvcm_version(self) -> str:
        """The name of this manager's version (``kvcm.versions``: the entry its class belongs to)."""
        return versions.of(type(self)).name

    def __init__(self, model: ModelSpec, kv_cache_config: KvCacheConfig | None = None, limits: Limits | None = None,
                 *, free_memory_bytes: int | None = None, mapping=None, pp_rank: int = 0, policy=None, **limit_fields):
        """``limits`` (a ``kvcm.Limits``), or its fields as keywords (``max_batch_size=..., max_seq_len=...``).
        ``policy`` (a ``kvcm.policy.Policy``; None: the active one, ``kvcm.policy.active()``): the decisions this
        manager, its pools and its reuse cache make, kept for their life.
        ``mapping`` (a ``kvcm.Mapping``): size the cache of one rank of pipeline stage ``pp_rank`` of a parallel
        deployment (its layers and its share of the KV heads, ``ModelSpec.for_rank``); ``free_memory_bytes`` is
        then that rank's GPU's."""
        if not isinstance(model, ModelSpec):
            raise ConfigError("model", type(model).__name__, "must be a kvcm.ModelSpec (or a DeepseekV4Spec through "
                              "create_kv_cache_manager); build one with ModelSpec.from_hf_config")
        if kv_cache_config is not None and not isinstance(kv_cache_config, KvCacheConfig):
            raise ConfigError("kv_cache_config", type(kv_cache_config).__name__, "must be a kvcm.KvCacheConfig or None")
        cfg = kv_cache_config or KvCacheConfig()
        self._version = versions.of(type(self))      # the entry whose factories build its pools and caches
        self.policy = resolve_policy(policy)
        _check_mapping(mapping, pp_rank)
        if mapping is not None:
            model = model.for_rank(mapping, pp_rank, policy=self.policy)
        self.mapping, self.pp_rank = mapping, pp_rank
        self.limits = Limits.of(limits, **limit_fields)
        free_memory_bytes = validation.optional_count("free_memory_bytes", free_memory_bytes)
        self.model = model if cfg.dtype == "auto" else model.with_dtype(cfg.dtype)
        self.kv_cache_config = cfg
        self.tokens_per_block = cfg.tokens_per_block
        self.free_memory_bytes = _free_memory(self.device, free_memory_bytes)
        self.layer_groups: list[LayerGroup] = self._build_groups()
        self._group_of_layer = {li: g.index for g in self.layer_groups for li in g.layers}
        self.constraints: list[BatchDesc] = []
        self.constraint_names: list[str] = []
        self.typical_step: BatchDesc | None = None
        self.budget_bytes = 0
        blocks = self._size_pools()
        for g, n in zip(self.layer_groups, blocks):
            if n < 1:
                raise ConfigError("kv_cache_config", "budget", f"leaves 0 blocks for layer group {g.index} ({g.name}); "
                                  f"one block there takes {g.bytes_per_block} bytes, the budget is {self.budget_bytes} bytes"
                                  + (f" (max_tokens={cfg.max_tokens} is under one block of {cfg.tokens_per_block} tokens)"
                                     if cfg.max_tokens is not None and cfg.max_tokens < cfg.tokens_per_block else ""))
            g.num_blocks = n
        pool = self._version.pool_class
        self.pools = [pool(g.num_blocks, g.bytes_per_block, self.device, policy=self.policy)
                      for g in self.layer_groups]
        self.stale_released = [0] * len(self.pools)   # pages V2 gave back as they left a window, per group
        self._seqs: dict[object, _Sequence] = {}
        self._views: dict[int, torch.Tensor] = {}
        self._init_reuse()
        self._init_events()
        user_rules.install(self)      # with a user's rule in the policy, a call in which it raises is undone

    # ---- the limits, read through ---------------------------------------------------------------------------
    max_batch_size = property(lambda self: self.limits.max_batch_size)
    max_seq_len = property(lambda self: self.limits.max_seq_len)
    max_num_tokens = property(lambda self: self.limits.max_num_tokens)
    max_draft_len = property(lambda self: self.limits.max_draft_len)
    num_extra_kv_tokens = property(lambda self: self.limits.num_extra_kv_tokens)
    device = property(lambda self: self.limits.device)

    # ---- sizing, overridden ---------------------------------------------------------------------------------
    def _build_groups(self) -> list[LayerGroup]:
        return build_layer_groups(self.model, self.tokens_per_block, self.policy)

    def _size_pools(self) -> list[int]:
        raise NotImplementedError

    def _budget_candidates(self) -> dict[str, int]:
        """Byte budgets from the config fields that are set (``max_tokens`` is handled by each version)."""
        cfg, out = self.kv_cache_config, {}
        if cfg.max_gpu_total_bytes is not None:
            out["max_gpu_total_bytes"] = cfg.max_gpu_total_bytes
        if cfg.free_gpu_memory_fraction is not None or (cfg.max_tokens is None and cfg.max_gpu_total_bytes is None):
            if self.free_memory_bytes is None:
                raise ConfigError("free_memory_bytes", None, f"is required on device {self.device.type!r} when "
                                  "neither max_tokens nor max_gpu_total_bytes is set")
            out["free_gpu_memory_fraction"] = int(cfg.fraction * self.free_memory_bytes)
        return out

    # ---- pools and pages ------------------------------------------------------------------------------------
    @property
    def pool_bytes(self) -> int:
        return sum(p.nbytes for p in self.pools)

    def group_of_layer(self, layer_idx: int) -> int:
        return self._group_of_layer[layer_idx]

    def layer_kv(self, layer_idx: int) -> torch.Tensor:
        """The layer's pages as ``[num_blocks, kv_factor, tpb, heads, dim]`` in its dtype, a view into its pool."""
        if layer_idx in self._views:
            return self._views[layer_idx]
        group = self.layer_groups[self.group_of_layer(layer_idx)]
        pool = self.pools[group.index]
        if pool.storage is None:
            raise ConfigError("device", "meta", "has no pages to view; build the manager with device='cpu' or 'cuda'")
        layer = self.model.layers[layer_idx]
        start = group.layer_offsets[layer_idx]
        raw = pool.storage[:, start:start + layer.bytes_per_block(self.tokens_per_block)]
        view = raw.view(layer.dtype).view(pool.num_blocks, *layer.kv_shape(self.tokens_per_block))
        self._views[layer_idx] = view
        return view

    def get_num_free_blocks(self) -> int:
        """Free blocks of the most constrained full-attention group (any group when none is full); cached
        blocks no request holds count as free, as TensorRT-LLM and vLLM report them (allocating evicts them)."""
        full = [p.num_free + p.num_reusable for g, p in zip(self.layer_groups, self.pools) if g.is_full]
        return min(full or [p.num_free + p.num_reusable for p in self.pools])

    @property
    def max_tokens(self) -> int:
        """Tokens one full-attention group can hold in all."""
        full = [g.num_blocks for g in self.layer_groups if g.is_full] or [g.num_blocks for g in self.layer_groups]
        return min(full) * self.tokens_per_block

    # ---- requests -------------------------------------------------------------------------------------------
    def _seq(self, request_id) -> _Sequence:
        try:
            return self._seqs[request_id]
        except KeyError:
            raise UnknownRequestError(request_id) from None
        except TypeError:
            validation.request_id(request_id)  # an unhashable id: raises ConfigError naming it
            raise

    def _new_seq(self, request_id) -> _Sequence:
        validation.request_id(request_id)
        if request_id in self._seqs:
            raise ConfigError("request_id", request_id, "is already held by this manager")
        seq = _Sequence(blocks=[[] for _ in self.layer_groups], stale_done=[0] * len(self.layer_groups))
        self._seqs[request_id] = seq
        return seq

    def has_request(self, request_id) -> bool:
        return validation.request_id(request_id) in self._seqs

    @property
    def request_ids(self) -> list:
        return list(self._seqs)

    def get_capacity(self, request_id) -> int:
        return self._seq(request_id).capacity

    def reset_page_usage(self) -> None:
        """Peaks from what is held now (an engine's own pad pages), no pages released yet: what one engine run's
        ``page_usage`` counts from. The manager resets its own figures; no caller writes them."""
        for pool in self.pools:
            pool.reset_peak()
        self.stale_released = [0] * len(self.pools)

    def get_history(self, request_id) -> int:
        return self._seq(request_id).history

    def block_table(self, request_id) -> list[list[int]]:
        """Per layer group, the physical block of each logical block (-1 where a stale block was released)."""
        return [list(b) for b in self._seq(request_id).blocks]

    def block_tables(self, request_ids) -> list[list[list[int]]]:
        """``block_table`` of each request, for a step's worth of requests in one call. The lists are the
        manager's own, not copies (an engine reads every running request's table every step, and copying them
        was a good part of its host time): read them before the next call that changes one of these requests,
        and never write to them. Where a subclass overrides ``block_table`` (a test's defective manager, handed to
        the engine's constructor), the tables are read through it, so the override is what an engine sees."""
        if type(self).block_table is not BaseKVCacheManager.block_table:
            return [self.block_table(rid) for rid in request_ids]
        seqs = self._seqs
        try:
            return [seqs[rid].blocks for rid in request_ids]
        except (KeyError, TypeError):
            if not hasattr(request_ids, "__iter__"):
                raise ConfigError("request_ids", request_ids, "must be a list of held request ids") from None
            for rid in request_ids:
                self._seq(rid)           # raises for the first id it does not hold, naming it
            raise

    def num_blocks_held(self, request_id) -> list[int]:
        return [sum(1 for b in blocks if b >= 0) for blocks in self._seq(request_id).blocks]

    def free_resources(self, request_id) -> None:
        seq = self._seqs.pop(validation.request_id(request_id), None)
        if seq is None:
            raise UnknownRequestError(request_id)
        if seq.reuse is not None:
            if seq.reuse.loading and self._held_for_loads(request_id, seq):
                return                       # an abort while its copies are in flight: freed once they land
            self._release_with_tokens(seq)
            self._settle()
            return
        for pool, blocks in zip(self.pools, seq.blocks):
            pool.release(blocks)

    def _release_all(self, request_ids) -> None:
        for rid in request_ids:
            if rid in self._seqs:
                self.free_resources(rid)

    def _release_with_tokens(self, seq) -> None:
        """A request made with token ids: the version stores what it stores at release, then lets go."""
        self._free_reuse(seq)

    def _out_of_pages(self, request_id, needs: list[int], what: str) -> OutOfPagesError:
        for g, (need, pool) in enumerate(zip(needs, self.pools)):
            if need > pool.num_available:
                return OutOfPagesError(request_id, g, need, pool.num_available, what)
        return OutOfPagesError(request_id, 0, needs[0], self.pools[0].num_available, what)

    def _roles(self, group: LayerGroup) -> list[str]:
        """What a group's layers store, first seen first (``KV`` for ordinary models)."""
        return list(dict.fromkeys(self.model.layers[i].role for i in group.layers))

    def describe(self) -> dict:
        """Pools, constraints and sizes as plain data (for `kvcm plan` and reports)."""
        tpb = self.tokens_per_block
        return {
            "kvcm_version": self.kvcm_version,
            "tokens_per_block": tpb,
            "budget_bytes": self.budget_bytes,
            "pool_bytes": self.pool_bytes,
            "max_tokens": self.max_tokens,
            "groups": [{"index": g.index, "name": g.name, "label": f"{g.index} {g.name}", "window": g.window,
                        "layers": len(g.layers), "roles": self._roles(g), "num_blocks": g.num_blocks,
                        "bytes_per_block": g.bytes_per_block, "bytes": g.num_blocks * g.bytes_per_block}
                       for g in self.layer_groups],
            "constraints": [{"name": n, "requests": _batch_summary(c)}
                            for n, c in zip(self.constraint_names, self.constraints)],
            "typical_step": None if self.typical_step is None else _batch_summary(self.typical_step),
        } | ({} if self.mapping is None else {"pp_rank": self.pp_rank, "num_layers": self.model.num_layers,
                                              "bytes_per_token": self._bytes_per_token_or_none()})

    def _bytes_per_token_or_none(self) -> int | None:
        """The rank's KV bytes a token (None where a role keeps fewer entries than tokens, as DeepSeek-V4's do)."""
        if any(layer.compress_ratio != 1 for layer in self.model.layers):
            return None
        return self.model.bytes_per_token()


def _batch_summary(batch: BatchDesc) -> list[dict]:
    """Run-length summary of a batch: [{count, capacity, history}]."""
    out: list[dict] = []
    for kv in batch.kv_caches:
        if out and out[-1]["capacity"] == kv.capacity and out[-1]["history"] == kv.history_length:
            out[-1]["count"] += 1
        else:
            out.append({"count": 1, "capacity": kv.capacity, "history": kv.history_length})
    return out


def _check_mapping(mapping, pp_rank) -> None:
    """A ``mapping`` that is a ``kvcm.Mapping`` (a dict of its fields used to end in an ``AttributeError``), and a
    ``pp_rank`` only with one (without, the manager is one GPU's and ``pp_rank`` was silently ignored)."""
    if mapping is None:
        if pp_rank != 0:
            raise ConfigError("pp_rank", pp_rank, "needs a mapping (kvcm.Mapping(pp_size=...)); without one the cache "
                              "is one GPU's, stage 0")
    elif not isinstance(mapping, Mapping):
        raise ConfigError("mapping", mapping, f"must be a kvcm.Mapping, not {type(mapping).__name__} (for a dict "
                          "of its fields: kvcm.Mapping(**fields))")


# ---- the decisions made here (kvcm.policy: a defect replaces one for a manager or a run) ----------------
class ManagerDecisions(Decisions):
    SUBSYSTEM = "available tokens (both versions)"

    @rule("the slots beyond the answer a request of the answer's length holds: the extra KV tokens and the draft "
          "tokens (TensorRT-LLM PR #17162: drafts left out, spec-decode dummies overflowed the pool)")
    def available_extra(num_extra_kv_tokens: int, num_draft_tokens: int) -> int:
        return num_extra_kv_tokens + num_draft_tokens

