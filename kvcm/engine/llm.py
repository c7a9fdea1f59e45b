"""``LLM``: the reference engine's front door (scheduler -> manager -> model runner -> attention -> sampler).

It runs a Hugging Face causal LM with its KV cache in a kvcm manager's page pools. Greedy only: it exists to
prove that a cache manager's capacity decisions give exactly the tokens an uncached model gives.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field, fields

import torch

from ..config import KvCacheConfig
from ..deprecation import renamed_attribute, renamed_keywords
from ..factory import create_kv_cache_manager
from ..model_spec import ModelSpec
from ..policy import resolve as resolve_policy
from ..units import human_bytes
from .. import draft_budget
from ..errors import ConfigError
from . import checks
from .attention import KernelOptions
from .cache import build_cache
from .config import EngineConfig
from .cuda_graph import GraphPlan
from .drafters import ModelDrafter, NgramDrafter
from . import page_usage as _page_usage
from . import reuse as _reuse
from .pipeline import StepPipeline
from . import spec_cutoff
from . import spec_gate as _gate
from .scheduler import Scheduler
from .sequence import SamplingParams, Sequence
from .stop_strings import StopStrings
from .trace import Tracer

_DTYPE_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}
#: Tokens of the default KV pool off CUDA: a reference run's work, not a server's (raise with kv_cache_config).
CPU_DEFAULT_MAX_TOKENS = 8192
log = logging.getLogger("kvcm.engine")


@dataclass
class RequestOutput:
    index: int
    prompt_token_ids: list[int]
    token_ids: list[int]
    text: str | None = None
    finish_reason: str | None = None
    logits_margins: list[float] = field(default_factory=list)
    num_preemptions: int = 0
    first_token_s: float | None = None     # seconds from the generate() call to its first output token


def eos_token_ids(model, tokenizer) -> tuple[int, ...]:
    """Every id that ends a generation: the tokenizer's EOS and the model's generation-config EOS.

    Both count because converted tokenizers disagree across transformers releases (SmolLM2's GGUF gives
    ``<|im_end|>`` on 5.24 and another id on 5.17): a baseline compared with this engine must stop on the same set.
    """
    ids = []
    for src in (getattr(tokenizer, "eos_token_id", None), getattr(model.generation_config, "eos_token_id", None)
                if getattr(model, "generation_config", None) is not None else None):
        if src is None:
            continue
        ids.extend(src if isinstance(src, (list, tuple)) else [src])
    return tuple(dict.fromkeys(int(i) for i in ids))



def default_kv_cache_config(model, *, max_batch_size: int, max_seq_len: int, device, max_num_tokens=None):
    """Model dtype; on CUDA half the free memory (the manager reads it). Elsewhere a small pool: a full batch of
    full-length requests, but at most ``CPU_DEFAULT_MAX_TOKENS`` (never less than one request of
    ``max_seq_len`` or one step of ``max_num_tokens``). The pages are real memory (``torch.zeros``); a pool
    sized for a server's batch would take gigabytes for a few prompts, and when the work outgrows the pool the
    scheduler preempts (recompute) rather than fail. ``LLM`` logs and ``repr``s what it reserved."""
    dtype = _DTYPE_NAMES.get(next(model.parameters()).dtype, "bfloat16")
    if torch.device(device).type == "cuda":
        return KvCacheConfig(free_gpu_memory_fraction=0.5, dtype=dtype)
    floor = max(max_seq_len, max_num_tokens or 0, CPU_DEFAULT_MAX_TOKENS)
    return KvCacheConfig(max_tokens=min(max_batch_size * max_seq_len, floor), dtype=dtype)


class LLM:
    @renamed_keywords(manager_version="kvcm_version", draft_manager_version="draft_kvcm_version")
    def __init__(self, model, tokenizer=None, *, manager=None, drafter=None, config: EngineConfig | None = None,
                 **options):
        """``cuda_graph``: warm up decode shapes (estimation cache, then final) and replay them for decode
        steps, and token buckets for mixed steps (``cuda_graph.py``); captured on CUDA, run statically
        (eagerly) on the CPU unless ``graph_capture`` says otherwise. ``overlap``: schedule and launch each
        step before the previous one's tokens are read (``pipeline.py``); same greedy tokens, less GPU idle.

        ``drafter``: speculative decoding with ``max_draft_len`` drafts a step, proposed by ``"ngram"``
        (TensorRT-LLM's n-gram pool with its defaults; the pool outlives ``generate`` calls, as upstream's lives
        with the executor), an ``NgramDrafter``, or a draft model (a causal LM sharing the tokenizer, with
        its own ``draft_kvcm_version`` cache; target and draft split one memory budget: ``kvcm.draft_budget``,
        unless ``draft_kv_cache_config`` sizes the draft's cache on its own).

        ``spec_max_concurrency``: speculate only while at most this many requests are active, plain (overlapped)
        steps above (TensorRT-LLM's ``max_concurrency``; ``spec_cutoff.py``, whose default comes from a GPU run);
        None speculates always, 0 never. ``spec_acceptance_window`` / ``spec_acceptance_threshold``: once the
        acceptance rate's mean over that many verifications falls below the threshold (None: the drafter's
        break-even, its ``cost_per_draft`` clipped to [0, 1]), speculation stops for good (TensorRT-LLM's
        speculation gate, ``spec_gate.py``; ``llm.spec_gate``); a window of 0 never stops.

        ``enable_block_reuse``: admit each request with its token ids so its prefill computes only what its
        manager has not cached (``reuse.py``; a draft model's cache reuses on its own); None follows
        ``kv_cache_config.enable_block_reuse`` (on by default, as in TensorRT-LLM). ``reuse_stats``: the last
        ``generate``'s hit rate.

        ``decode_split_len``: on the Triton kernels, a decode step's attention reads each sequence's keys in shares
        of this many positions, one program each, and combines them (flash-decoding; a multiple of 32; 0, the
        default, reads a sequence's keys in one program): long contexts at small batches read in parallel.
        ``prefill_block_m``: the kernel's query rows a program on every other step (a power of two up to 128;
        None, the default, takes its least tile, 16 rows): more of a prefill chunk's tokens share each key tile
        read. ``fused_layers``: where the kernels run, a Llama-family model's layers take nine launches each
        (``fused_layers.py``) rather than its own code's fifteen. ``pipelined_keys``: the attention kernel's key
        loop as one the compiler software-pipelines (off: on an H100 it did not speed the decode step and slowed
        the mixed one; ``triton_attention.paged_attention``). ``decode_rows_by_index``: on a decode step (every row
        the same number of queries) each attention program takes its sequence by index rather than searching the
        query offsets (on by default; off only to time the search). ``step_row_map``: on any other step the programs
        read their sequence from a map one launch searches once a step, where each layer's programs search again
        (off until a GPU run measures it). All become one ``KernelOptions``, passed down to every cache's runner.

        ``host_cache_size``: bytes of host memory for the host tier (TensorRT-LLM's ``KvCacheConfig.host_cache_size``;
        V1's secondary pool, ``kvcm/reuse/host_tier.py``, or V2's host level, ``kvcm/reuse/host_level.py``): cached
        pages an allocation evicts are copied there (pinned memory on CUDA)
        and copied back on a hit instead of being recomputed; overrides ``kv_cache_config.host_cache_size``.

        ``manager_version=`` / ``draft_manager_version=`` are the deprecated spellings of ``kvcm_version=`` /
        ``draft_kvcm_version=``.

        Every option is a field of ``EngineConfig`` (``kvcm/engine/config.py``), checked there before any page
        is allocated; pass the fields as keywords or one ``config=EngineConfig(...)``. ``max_draft_len`` may be
        left out with a drafter object: its ``num_draft`` is the draft length.
        """
        model, tokenizer = checks.load_model(model, tokenizer)
        if config is not None and options:
            raise ConfigError("config", "EngineConfig(...)", f"give the options in it or as keywords, not both "
                                                             f"({', '.join(options)} given beside it)")
        unknown = [k for k in options if k not in EngineConfig.OPTIONS]
        if unknown:
            raise TypeError(f"LLM() got an unexpected keyword argument {unknown[0]!r} (its options: EngineConfig's "
                            f"fields)")
        config = (config if config is not None else EngineConfig(**options)).with_drafter(drafter)
        config.check_model(model, drafter)
        self.config = config
        c = config
        self.policy = policy = resolve_policy(c.policy)   # every cache, scheduler and drafter below takes it
        # the one bundle every cache this engine builds is sized for (a draft cache: max_seq_len + D)
        self.limits = c.limits
        max_seq_len, max_draft_len, device = c.max_seq_len, c.max_draft_len, c.device
        kernel = KernelOptions(**{f.name: getattr(c, f.name) for f in fields(KernelOptions)})   # EngineConfig names each
        self.spec_max_concurrency = c.spec_max_concurrency
        self.spec_acceptance_window, self.spec_acceptance_threshold = c.spec_acceptance_window, c.spec_acceptance_threshold
        self.model = model.to(device).eval()
        self.tokenizer = tokenizer
        self._stop_strings = StopStrings(tokenizer)    # its per-token texts serve every generate
        kv_cache_config = c.kv_cache_config
        if kv_cache_config is None:
            kv_cache_config = default_kv_cache_config(model, max_batch_size=c.max_batch_size, max_seq_len=max_seq_len,
                                                      device=device, max_num_tokens=c.max_num_tokens)
        if c.host_cache_size is not None:
            kv_cache_config = kv_cache_config.replace(host_cache_size=c.host_cache_size)
        self.kv_cache_config = kv_cache_config
        self.kvcm_version = kvcm_version = c.kvcm_version
        self.model_spec = ModelSpec.from_hf_config(model.config)
        self.eos_token_ids = eos_token_ids(model, tokenizer)
        draft_model = drafter if isinstance(drafter, torch.nn.Module) else None
        target_cfg = draft_cfg = kv_cache_config
        if draft_model is not None:
            free = torch.cuda.mem_get_info(self.device)[0] if self.device.type == "cuda" else None
            target_cfg, draft_cfg = draft_budget.split_draft_budget(
                kv_cache_config, self.model_spec, ModelSpec.from_hf_config(draft_model.config),
                free_memory_bytes=free, policy=policy)
            if c.draft_kv_cache_config is not None:
                target_cfg, draft_cfg = kv_cache_config, c.draft_kv_cache_config
        plan = None
        if c.cuda_graph:
            plan = GraphPlan(batch_sizes=c.cuda_graph_batch_sizes, token_buckets=c.cuda_graph_token_buckets,
                             two_model=max_draft_len > 0, capture=c.graph_capture)
        self.tracer = Tracer() if c.trace else None
        target = build_cache(self.model, self.device, self._factory(kvcm_version, self.model_spec,
                                                                    max_seq_len), target_cfg, plan,
                             max_seq_len=max_seq_len, manager=manager, tracer=self.tracer, kernel=kernel, policy=policy)
        self.manager, self.runner, self.graphs, self.warmup_reports = (target.manager, target.runner,
                                                                         target.graphs, target.reports)
        self.drafter, self.draft_warmup_reports = None, []
        if draft_model is not None:
            draft_model = draft_model.to(device).eval()
            # the draft runs up to D - 1 positions past the target's last slot
            draft_plan = None if plan is None else GraphPlan(
                batch_sizes=c.cuda_graph_batch_sizes, token_buckets=c.cuda_graph_token_buckets, draft_lens=(1, 0),
                capture=c.graph_capture)
            dv = c.draft_kvcm_version or kvcm_version
            draft = build_cache(draft_model, self.device,
                                self._factory(dv, ModelSpec.from_hf_config(draft_model.config),
                                              max_seq_len + max_draft_len), draft_cfg, draft_plan,
                                max_seq_len=max_seq_len + max_draft_len, kernel=kernel, policy=policy)
            self.drafter = ModelDrafter(draft.runner, max_draft_len, name=f"model-{dv}", graphs=draft.graphs,
                                        cost_per_draft=_gate.parameter_share(draft_model, self.model), policy=policy)
            self.draft_warmup_reports = draft.reports
        elif drafter is not None:
            self.drafter = NgramDrafter(max_draft_len) if drafter == "ngram" else drafter
        self.enable_block_reuse = self._reuse_flag(c.enable_block_reuse)
        if isinstance(self.drafter, ModelDrafter):
            self.drafter.reuse = self.enable_block_reuse and _reuse.can_reuse(self.drafter.manager)
        self.reuse_stats = _reuse.ReuseStats()
        self.spec_stats = None        # the drafter's acceptance (``spec_stats.SpecStats``) in the last generate
        self.num_preemptions = 0      # requests preempted by recompute in the last generate
        self.pipeline = StepPipeline(self.runner, self.graphs, overlap=c.overlap)
        log.info("%r", self)

    def _reuse_flag(self, asked) -> bool:
        able = _reuse.can_reuse(self.manager)
        if asked is None:
            return able
        if type(asked) is not bool:
            raise ConfigError("enable_block_reuse", asked, "must be True, False or None")
        if asked and not able:
            raise ConfigError("enable_block_reuse", asked, "needs a manager with block reuse on "
                                                           "(kv_cache_config.enable_block_reuse=True)")
        return asked

    def reserved(self) -> str:
        """What this engine holds for its KV cache, in words (the draft model's cache too, when there is one)."""
        mgr = self.manager
        text = (f"KV cache {human_bytes(mgr.pool_bytes)} on {self.device.type} = {mgr.max_tokens:,} tokens "
                f"({mgr.kvcm_version}, {mgr.tokens_per_block} tokens a block)")
        draft = getattr(self.drafter, "manager", None)
        if draft is not None:
            text += f" + draft KV cache {human_bytes(draft.pool_bytes)}"
        return text

    def __repr__(self) -> str:
        params = sum(p.numel() for p in self.model.parameters())
        return (f"LLM({type(self.model).__name__}, {params / 1e6:,.0f}M params, {self.reserved()}, "
                f"max_batch_size={self.max_batch_size}, max_seq_len={self.max_seq_len})")

    def _factory(self, kvcm_version, spec, max_seq_len):
        limits = self.limits.replace(max_seq_len=max_seq_len)
        return lambda cfg: create_kv_cache_manager(kvcm_version, spec, cfg, limits, policy=self.policy)

    @property
    def spec_max_concurrency(self) -> int | None:
        """The speculation cut-off (``spec_cutoff.py``); checked when set, so a benchmark may change it between
        ``generate`` calls."""
        return self._spec_max_concurrency

    @spec_max_concurrency.setter
    def spec_max_concurrency(self, value) -> None:
        self._spec_max_concurrency = spec_cutoff.check(value)

    @property
    def spec_acceptance_window(self) -> int:
        return self._spec_window

    @spec_acceptance_window.setter
    def spec_acceptance_window(self, value) -> None:
        self._spec_window, self._spec_gate = _gate.check_window(value), None    # a new gate at the next run

    @property
    def spec_acceptance_threshold(self) -> float | None:
        return self._spec_threshold

    @spec_acceptance_threshold.setter
    def spec_acceptance_threshold(self, value) -> None:
        self._spec_threshold, self._spec_gate = _gate.check_threshold(value), None

    def reset_spec_gate(self) -> None:
        """Open the acceptance gate again with nothing recorded (upstream's ``SpeculationGate.reset``): a
        benchmark's timed run judges its drafter from scratch, as a cold n-gram pool is cleared."""
        self._spec_gate = None

    @property
    def spec_gate(self) -> _gate.SpeculationGate | None:
        """The acceptance gate the next ``generate`` uses (``spec_gate.py``), kept across calls; None without a
        drafter or with a window of 0. A new drafter, window or threshold starts a new one."""
        if self.drafter is None or not self._spec_window:
            return None
        if self._spec_gate is None or self._spec_gate_drafter is not self.drafter:
            threshold = self._spec_threshold
            if threshold is None:
                threshold = min(1.0, max(0.0, float(getattr(self.drafter, "cost_per_draft", 0.0))))
            self._spec_gate = _gate.SpeculationGate(self._spec_window, threshold)
            self._spec_gate_drafter = self.drafter
        return self._spec_gate

    max_batch_size = property(lambda self: self.limits.max_batch_size)
    max_seq_len = property(lambda self: self.limits.max_seq_len)
    max_num_tokens = property(lambda self: self.limits.max_num_tokens)
    max_draft_len = property(lambda self: self.limits.max_draft_len)
    device = property(lambda self: self.limits.device)
    manager_version = renamed_attribute("kvcm_version")

    def close(self) -> None:
        """Drop graphs and give the engine's own pages (the graph pad request) back to the managers."""
        if self.graphs is not None:
            self.graphs.release()
            self.graphs = self.pipeline.graphs = None
        if self.drafter is not None:
            self.drafter.close()

    def reset_prefix_cache(self) -> bool:
        """Drop every cached block of the target's cache and the draft model's (vLLM's ``LLM.reset_prefix_cache``):
        the next ``generate`` starts cold, as a benchmark's timed run or a changed model needs. False, with that
        cache unchanged, while a request holds its pages (a ``generate`` that raised part way)."""
        ok = True
        for mgr, graphs in ((self.manager, self.graphs),
                            (getattr(self.drafter, "manager", None), getattr(self.drafter, "graphs", None))):
            if mgr is not None:
                ok &= graphs.reset_prefix_cache() if graphs is not None else mgr.reset_prefix_cache()
        return ok

    @property
    def page_usage(self) -> list[_page_usage.GroupUsage]:
        """Per layer group of the target cache, for the last ``generate``: peak pages held and pages released
        as they left a sliding window (``page_usage.py``)."""
        return _page_usage.usage(self.manager)

    @property
    def trace(self):
        return self.tracer.records if self.tracer is not None else None

    def generate(self, prompts, params: SamplingParams | dict | None = None, *,
                 on_finish=None) -> list[RequestOutput]:
        """Greedy generation; outputs in prompt order (output ids include the stop token). ``prompts``: token-id
        lists, strings (with a tokenizer), vLLM prompt dicts, an integer tensor, or one prompt of any of these
        (``checks.prompts``); ``params``: a ``SamplingParams`` or a dict of its fields. Checked before any work.
        ``on_finish(i)`` is called as prompt ``i``'s request finishes, in finishing order (a progress bar per
        request rather than per call); one that raises ends the call with ``UserCallbackError`` naming it. A call
        that raises, for any reason, first frees every request it made."""
        params = checks.sampling_params(params, SamplingParams)
        prompts = checks.prompts(prompts, self.tokenizer, self.model.config.vocab_size, self.max_seq_len)
        if self._stop_strings.tokenizer is not self.tokenizer:      # a tokenizer set after construction
            self._stop_strings = StopStrings(self.tokenizer)
        scheduler = Scheduler(self.manager, self.limits, eos_token_ids=self.eos_token_ids,
                              tokenizer=self.tokenizer, drafter=self.drafter, reuse=self.enable_block_reuse,
                              on_finish=on_finish, spec_max_concurrency=self.spec_max_concurrency,
                              spec_gate=self.spec_gate,
                              stop_strings=self._stop_strings, policy=self.policy)
        # the last generate's figures, each kept by the scheduler that ran it
        self.reuse_stats, self.spec_stats = scheduler.reuse_stats, scheduler.spec_stats
        seqs = []
        for i, prompt in enumerate(prompts):
            seq = Sequence(prompt, params, index=i)
            scheduler.add(seq)
            seqs.append(seq)
        _page_usage.reset(self.manager)
        started = time.perf_counter()
        try:
            self.pipeline.run(scheduler)
        except BaseException:
            scheduler.abort()            # nothing this call made stays held (a user's on_finish, a forward...)
            raise
        self.num_preemptions = scheduler.num_preemptions
        return [self._output(s, started) for s in seqs]

    def _output(self, seq: Sequence, started: float) -> RequestOutput:
        text = None
        if self.tokenizer is not None:
            text = self.tokenizer.decode(seq.output_token_ids, skip_special_tokens=True)
            if seq.stop_string is not None and seq.stop_string in text:
                text = text[:text.index(seq.stop_string)]
        first = seq.first_token_time - started if seq.first_token_time is not None else None
        return RequestOutput(seq.index, seq.prompt_token_ids, seq.output_token_ids, text, seq.finish_reason,
                             seq.logits_margins, seq.num_preemptions, first)
