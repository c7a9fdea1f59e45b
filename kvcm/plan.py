"""``kvcm plan``: size a model's KV cache on paper, the way an engine would at start-up.

No GPU and no weights: a model config, a memory budget and the engine's limits in, and out the estimation
cache, the final pools, their constraints, max tokens, max concurrency and the CUDA-graph warmup plan.
The text a person reads is written by :mod:`kvcm.plan_text`; ``--json`` prints the dict built here.

Only the standard library is imported at module level: ``kvcm plan --help`` and a bad ``--model`` answer
before torch loads.
"""

from __future__ import annotations

import argparse
import json
import sys

from . import versions
from .embedded import embedded_models, load_config, load_spec
from .plan_checks import check_args
from .units import GiB, ceil_div

DEFAULT_MODEL = "qwen3-0.6b"
DEFAULT_FREE_GIB = 80.0


def load_model(name: str, option: str = "--model"):
    """An embedded config name, or a path to a ``config.json``; a bad name or a bad config exits with one line
    that names the option it came from (``--model`` or ``--draft-model``)."""
    from .errors import ConfigError

    try:
        load_config(name)
    except ConfigError as exc:
        raise SystemExit(f"kvcm plan: {option} {name!r}: {exc.limit}") from None
    try:
        return load_spec(name)
    except ConfigError as exc:
        raise SystemExit(f"kvcm plan: {option} {name!r}: {exc}") from None
    except (KeyError, TypeError, ValueError) as exc:  # a field of an unexpected type deep in the config
        raise SystemExit(f"kvcm plan: {option} {name!r}: the config cannot be read ({type(exc).__name__}: {exc})"
                         ) from None


def is_deepseek_v4(model) -> bool:
    from .deepseek_v4 import DeepseekV4Spec

    return isinstance(model, DeepseekV4Spec)


def max_concurrency(manager, seq_len: int) -> int:
    """Requests of ``seq_len`` tokens (all but the last computed) that fit at once."""
    tpb = manager.tokens_per_block
    counts = []
    for g in manager.layer_groups:
        need = (g.pages_needed(seq_len, seq_len - 1) if manager.releases_window_pages
                else ceil_div(seq_len, tpb))
        counts.append(g.num_blocks // max(need, 1))
    return min(counts)


def plan(args, progress: bool | None = None) -> dict:
    """The plan as a dict (``--json``). ``progress``: a bar on stderr per manager built (None: on a terminal)."""
    mapping = check_args(args)  # first: bad options and a bad name answer before the managers and torch load
    model = load_model(args.model)
    from .errors import KvcmError
    from .estimation import build_with_estimation
    from .limits import Limits

    deepseek = is_deepseek_v4(model)
    serving = versions.serving_deepseek_v4()
    if deepseek and args.kvcm_version not in (*serving, versions.ALL):
        raise SystemExit(f"kvcm plan: --kvcm-version {args.kvcm_version}: DeepSeek-V4 is planned by V2 only (its "
                         f"compressed and sliding-window groups need V2's layer groups); use --kvcm-version "
                         f"{serving[0]}")
    tpb = args.tpb if args.tpb is not None else 128 if deepseek else 32
    cfg = cache_config(tpb=tpb, max_tokens=args.max_tokens, dtype=args.dtype, fraction=args.fraction,
                       max_gpu_total_bytes=None if args.max_gpu_total_gib is None else int(args.max_gpu_total_gib * GiB),
                       enable_block_reuse=not args.no_block_reuse, enable_partial_reuse=not args.no_partial_reuse)
    planned = [v for v in versions.selected(args.kvcm_version) if not deepseek or v in serving]
    out = {"model": args.model, "free_memory_bytes": int(args.free_gib * GiB), "max_batch_size": args.max_batch_size,
           "max_seq_len": args.max_seq_len, "max_num_tokens": args.max_num_tokens, "max_draft_len": args.max_draft_len,
           "num_extra_kv_tokens": args.extra_kv_tokens, "tokens_per_block": tpb, "dtype": args.dtype,
           "free_gpu_memory_fraction": args.fraction, "max_tokens": args.max_tokens,
           "max_gpu_total_bytes": cfg.max_gpu_total_bytes, "notes": [], "managers": []}
    if mapping is not None:
        out["parallel"] = mapping.as_dict()
    from .reuse.plan import plan_entry
    out["block_reuse"] = plan_entry(cfg, deepseek)     # changes nothing in the pools; what it does at run time
    draft = _draft_split(args, model, cfg, out, mapping)
    if draft is not None:
        cfg = draft[1]
    if deepseek and args.kvcm_version == versions.ALL:
        out["notes"].append("DeepSeek-V4 is planned by V2 only (its compressed and sliding-window groups need V2)")
    for kvcm_version in _progress(planned, progress):
        entry, manager_class = {"kvcm_version": kvcm_version}, versions.get(kvcm_version).cls
        try:
            limits = Limits(args.max_batch_size, args.max_seq_len, args.max_num_tokens, args.max_draft_len,
                            args.extra_kv_tokens, device="meta")
            def build(r, config):
                return build_with_estimation(kvcm_version, model, config, limits,
                                             free_memory_bytes=int(args.free_gib * GiB),
                                             two_model=args.two_model or draft is not None, mapping=mapping, pp_rank=r)

            from .plan_parallel import build_stages   # V1 takes every rank's max_tokens down to the fewest
            stages = build_stages(model, mapping, cfg, build, manager_class.common_max_tokens_across_ranks)
            est = stages[0]   # with --pp: stage 0's in detail below, every stage's in "stages"
            if draft is not None:
                from .factory import create_kv_cache_manager
                draft_limits = limits.replace(max_seq_len=args.max_seq_len + args.max_draft_len, num_extra_kv_tokens=0)
                entry["draft"] = create_kv_cache_manager(kvcm_version, draft[0], draft[2], draft_limits, mapping=mapping,
                                                         free_memory_bytes=int(args.free_gib * GiB)).describe()
        except KvcmError as exc:
            entry["error"] = f"{type(exc).__name__}: {exc}"
            if getattr(exc, "trtllm", None) is not None:   # the pool TensorRT-LLM would build, and its excess
                entry["trtllm_pool"] = exc.trtllm.as_dict()
            out["managers"].append(entry)
            continue
        final = est.manager
        if manager_class.trtllm_estimation_path and not deepseek:   # TensorRT-LLM's estimation max_tokens (semantics.md 10)
            from .estimation_tokens import trtllm_estimation_max_tokens_for

            entry["trtllm_estimation_max_tokens"] = trtllm_estimation_max_tokens_for(
                limits, tpb, len({g.window for g in final.layer_groups}))
        entry.update(estimation=est.estimation, final=final.describe(),
                     max_concurrency=max_concurrency(final, args.max_seq_len),
                     warmup=[w.as_dict() for w in est.warmups])
        from .plan_host_tier import entry as host_tier_entry
        host_tier = host_tier_entry(final, args)
        if host_tier is not None:
            entry["host_tier"] = host_tier
        if mapping is not None:
            from .plan_parallel import deployment, stage_entries
            entry["stages"] = stage_entries(stages, model, mapping,
                                            lambda m: max_concurrency(m, args.max_seq_len))
            entry["deployment"] = deployment(entry["stages"], mapping, args.max_batch_size)
        out["managers"].append(entry)
    return out


_OPTION_OF_FIELD = {"tokens_per_block": "--tpb", "max_tokens": "--max-tokens", "dtype": "--dtype",
                    "free_gpu_memory_fraction": "--fraction", "max_gpu_total_bytes": "--max-gpu-total-gib"}


def cache_config(*, tpb, max_tokens, max_gpu_total_bytes, fraction, dtype, enable_block_reuse=True,
                 enable_partial_reuse=True):
    """The ``KvCacheConfig`` of the options; a bad value's error names the option it came from."""
    from .config import KvCacheConfig
    from .errors import ConfigError

    try:
        return KvCacheConfig(tokens_per_block=tpb, max_tokens=max_tokens, max_gpu_total_bytes=max_gpu_total_bytes,
                             free_gpu_memory_fraction=fraction, dtype=dtype, enable_block_reuse=enable_block_reuse,
                             enable_partial_reuse=enable_partial_reuse)
    except ConfigError as exc:
        option = _OPTION_OF_FIELD.get(exc.field)
        raise ConfigError(f"{option} ({exc.field})" if option else exc.field, exc.value, exc.limit) from None


def _draft_split(args, model, cfg, out, mapping=None):
    """``--draft-model``: (draft spec, target config, draft config), one byte budget split between the two
    caches by KV bytes per token (``kvcm.draft_budget``), a rank's with ``--tp`` (TensorRT-LLM sizes both with
    the mapping); the split goes into ``out["draft_split"]``."""
    if not getattr(args, "draft_model", None):
        return None
    from .draft_budget import split_draft_budget, total_budget_bytes
    from .errors import ConfigError

    draft_spec = load_model(args.draft_model, "--draft-model")
    free = int(args.free_gib * GiB)
    target, draft = model, draft_spec
    if mapping is not None and hasattr(model, "for_rank") and hasattr(draft_spec, "for_rank"):
        try:
            target, draft = model.for_rank(mapping), draft_spec.for_rank(mapping)
        except ConfigError as exc:
            raise ConfigError(f"--tp (the draft model's {exc.field})", exc.value, exc.limit) from None
    target_cfg, draft_cfg = split_draft_budget(cfg, target, draft, free_memory_bytes=free)
    out["draft_split"] = {"draft_model": args.draft_model, "total_bytes": total_budget_bytes(cfg, free),
                          "target_bytes": target_cfg.max_gpu_total_bytes, "draft_bytes": draft_cfg.max_gpu_total_bytes}
    return draft_spec, target_cfg, draft_cfg


def _progress(planned: list[str], show: bool | None):
    """A bar over the managers being built (estimation cache, warmup, final cache each); on a terminal only."""
    if show is False or len(planned) < 2:
        return planned
    try:
        from tqdm import tqdm
    except ImportError:  # progress is a nicety, never a requirement
        return planned
    return tqdm(planned, desc="kvcm plan", unit="manager", leave=False, disable=None if show is None else not show)


def render(result: dict) -> str:
    from .plan_text import render as render_text

    return render_text(result)


class _HelpWithDefaults(argparse.ArgumentDefaultsHelpFormatter):
    """Appends ``(default: X)``; a flag's is ``off``; an unset option's help says what applies instead."""

    def _get_help_string(self, action):
        text = action.help or ""
        if "default:" in text or action.default is argparse.SUPPRESS:
            return text
        if action.default is False and action.nargs == 0:
            return f"{text} (default: off)"
        if action.default is None:
            return text
        return super()._get_help_string(action)


class _OldVersionFlag(argparse.Action):
    """``--version``, the old spelling of ``--kvcm-version`` (and the usual spelling of "print the program's
    version"): still stored, with a note on stderr; hidden from ``--help``."""

    def __call__(self, parser, namespace, values, option_string=None):
        print(f"kvcm plan: {option_string} is deprecated; use --kvcm-version", file=sys.stderr)
        setattr(namespace, self.dest, values)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.formatter_class = _HelpWithDefaults
    p.allow_abbrev = False   # a prefix must not stand for another option (``--tp 8`` is not ``--tpb 8``)
    p.description = ("Size a model's KV cache the way an engine does at start-up, on paper (no GPU, no weights): "
                     "budget, pools per layer group, tokens, requests that fit, and the CUDA-graph warmup plan.")
    p.add_argument("--model", default=DEFAULT_MODEL, help=f"embedded config ({', '.join(embedded_models())}) or a "
                                                          "config.json path")
    p.add_argument("--kvcm-version", choices=[*versions.NAMES, versions.ALL], default=versions.ALL,
                   help="manager version(s) to plan; DeepSeek-V4 is V2 only")
    p.add_argument("--version", choices=[*versions.NAMES, versions.ALL], dest="kvcm_version", action=_OldVersionFlag,
                   help=argparse.SUPPRESS)
    p.add_argument("--free-gib", type=float, default=DEFAULT_FREE_GIB,
                   help="free device memory in GiB that --fraction applies to (an H100's 80 GiB)")
    p.add_argument("--fraction", type=float, default=None,
                   help="free_gpu_memory_fraction: the share of free memory for the KV cache (default: 0.9)")
    p.add_argument("--max-tokens", type=int, default=None,
                   help="cap the cache at this many tokens (KvCacheConfig.max_tokens; the smallest budget wins; "
                   "default: no cap)")
    p.add_argument("--max-gpu-total-gib", type=float, default=None,
                   help="cap the cache at this many GiB (KvCacheConfig.max_gpu_total_bytes; default: no cap)")
    p.add_argument("-B", "--max-batch-size", type=int, default=256, help="requests scheduled at once at most")
    p.add_argument("-S", "--max-seq-len", type=int, default=8192, help="tokens of one request at most (prompt + output)")
    p.add_argument("-N", "--max-num-tokens", type=int, default=8192, help="tokens computed in one step at most")
    p.add_argument("-D", "--max-draft-len", type=int, default=0, help="speculative draft tokens per request per step")
    p.add_argument("-E", "--extra-kv-tokens", type=int, default=0,
                   help="extra KV slots per request (e.g. MTP's extra tokens)")
    p.add_argument("--draft-model", default=None,
                   help="a draft model (embedded config or config.json) for two-model speculation: its cache and the "
                   "target's split one budget (default: none)")
    p.add_argument("--two-model", action="store_true", help="two-model speculation: warm up draft length 0 too (default: off)")
    p.add_argument("--tpb", type=int, default=None, help="tokens per block (default: 32; 128 for DeepSeek-V4)")
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel GPUs a pipeline stage: each rank keeps "
                   "ceil(KV heads / tp) heads (an MLA latent whole); the plan is one rank's, and the deployment's")
    p.add_argument("--pp", type=int, default=1, help="pipeline-parallel stages: each keeps its run of layers")
    p.add_argument("--attention-dp", action="store_true", help="attention data parallelism: each of the --tp ranks "
                   "runs attention for its own requests with every head, its own pool (default: off)")
    p.add_argument("--dtype", default="bfloat16", help="KV cache dtype (auto: each layer's own)")
    p.add_argument("--no-block-reuse", action="store_true",
                   help="block reuse (prefix caching) off: KvCacheConfig.enable_block_reuse=False; the pools are sized "
                   "the same either way (default: off, so reuse is on)")
    p.add_argument("--no-partial-reuse", action="store_true",
                   help="reuse whole blocks only: KvCacheConfig.enable_partial_reuse=False (default: off, so a partly "
                   "matched block is reused too)")
    from .plan_host_tier import add_arguments as host_tier_arguments
    host_tier_arguments(p)
    p.add_argument("--json", action="store_true", help="print the plan as JSON (for machines) instead of text (default: off)")


def main(args) -> int:
    result = plan(args)
    print(json.dumps(result, indent=2) if args.json else render(result))
    return 1 if any("error" in m for m in result["managers"]) else 0
