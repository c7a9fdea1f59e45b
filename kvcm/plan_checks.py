"""``kvcm plan``'s options checked against their limits and the model configs, before torch loads.

Each check reads the config files only (``kvcm.embedded.load_config``): a bad number, a config of millions of
layers or a draft model that cannot serve its target is refused with a ``ConfigError`` that names the option, in
the time it takes to read a JSON file, instead of after the managers are built or never.
"""

from __future__ import annotations

from .embedded import load_config
from .units import GiB
MAX_GIB = float(2**20)
"""The most device memory ``--free-gib`` and ``--max-gpu-total-gib`` take: 1 PiB, over a thousand times any
accelerator's; past it a typo (``1e12``, ``1e300``) is refused instead of planned (or overflowing)."""


def _config_or_none(name: str) -> dict | None:
    from .errors import ConfigError

    try:
        return load_config(name)
    except ConfigError:
        return None  # load_model reports the bad name


def check_args(args):
    """Every numeric option against its limit before torch loads; ``ConfigError`` names the option. Returns the
    deployment's ``kvcm.Mapping`` (None for one GPU)."""
    from . import validation
    from .errors import ConfigError
    from .plan_parallel import mapping_of

    config = _config_or_none(args.model)
    positions = _positions(config)
    validation.finite("--free-gib", args.free_gib, 0, MAX_GIB, open_low=True)
    if args.fraction is not None:
        validation.finite("--fraction", args.fraction, 0, 1, open_low=True, open_high=True)
    if args.max_gpu_total_gib is not None:
        validation.finite("--max-gpu-total-gib", args.max_gpu_total_gib, 1 / GiB, MAX_GIB)
    validation.optional_count("--max-tokens", args.max_tokens, 1)
    tpb = args.tpb if args.tpb is not None else 128 if _is_deepseek_v4(config) else 32
    if args.max_tokens is not None and args.max_tokens < tpb:  # V1 said "the budget is 0", V2 "3670016 bytes"
        raise ConfigError("--max-tokens", args.max_tokens, f"must be >= {tpb}, one block of {tpb} tokens [--tpb]: "
                          "the pools hold whole blocks (V1 floors a token cap to blocks and V2 needs a block a request)")
    validation.count("-B/--max-batch-size", args.max_batch_size, 1, validation.MAX_BATCH_SIZE, "kvcm.MAX_BATCH_SIZE")
    cap = min(positions or validation.MAX_SEQ_LEN, validation.MAX_SEQ_LEN)
    validation.count("-S/--max-seq-len", args.max_seq_len, 1, cap,
                     "the model's max_position_embeddings" if cap == positions else "kvcm.MAX_SEQ_LEN")
    validation.count("-N/--max-num-tokens", args.max_num_tokens, 1)
    validation.count("-D/--max-draft-len", args.max_draft_len, 0, args.max_num_tokens - 1,
                     "-N - 1: a step verifying D drafts of one request computes 1 + D tokens, -N at most")
    validation.count("-E/--extra-kv-tokens", args.extra_kv_tokens, 0)
    if args.tpb is not None:
        validation.power_of_two("--tpb", args.tpb)
    _check_layers("--model", args.model, config, args.max_draft_len)
    if args.two_model and args.max_draft_len == 0:
        raise ConfigError("--two-model", True, "needs -D/--max-draft-len >= 1: it warms up draft length 0 beside D, "
                                               "and with -D 0 there is no draft length to add")
    if args.draft_model is not None:  # '' used to mean "no draft model", silently
        _check_draft(args, config)
    from .plan_host_tier import check as check_host_tier
    check_host_tier(args, MAX_GIB)
    return mapping_of(args, config)


def _positions(config: dict | None) -> int | None:
    value = (config or {}).get("max_position_embeddings")
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 1 else None


def _is_deepseek_v4(config: dict | None) -> bool:
    return (config or {}).get("model_type") == "deepseek_v4"


def _check_layers(option: str, name: str, config: dict | None, max_draft_len: int) -> None:
    """At most ``kvcm.MAX_LAYERS`` layers (a DeepSeek-V4 model's MTP layers included), read from the file before
    torch loads: a config of millions of layers is refused at once instead of planned for minutes."""
    from .errors import ConfigError
    from .validation import MAX_LAYERS, MAX_LAYERS_WHY

    if config is None:
        return
    if _is_deepseek_v4(config):
        base = len(config.get("layer_types") or config.get("compress_ratios") or range(43))
        if base + max(0, max_draft_len - 1) > MAX_LAYERS:
            what = ("-D/--max-draft-len", max_draft_len) if base <= MAX_LAYERS else (f"{option} {name!r}: layers", base)
            raise ConfigError(what[0], what[1], f"{name} caches {base} layers plus D - 1 MTP layers, at most "
                                                f"{MAX_LAYERS} in all ({MAX_LAYERS_WHY})")
        return
    layers = config.get("num_hidden_layers")
    if isinstance(layers, int) and not isinstance(layers, bool) and layers > MAX_LAYERS:
        raise ConfigError(f"{option} {name!r}: num_hidden_layers", layers, f"must be <= {MAX_LAYERS} ({MAX_LAYERS_WHY})")


def _check_draft(args, target: dict | None) -> None:
    """``--draft-model`` against the target and the limits: two models only for ordinary attention, at least one
    draft token a step, and the draft's positions must hold a request with its drafts (``-S + -D``)."""
    from .errors import ConfigError

    if not args.draft_model.strip():
        raise ConfigError("--draft-model", args.draft_model, "is empty; give an embedded config's name or a "
                          "config.json path, or leave the option out for no draft model")
    try:
        draft = load_config(args.draft_model)
    except ConfigError as exc:
        raise SystemExit(f"kvcm plan: --draft-model {args.draft_model!r}: {exc.limit}") from None
    if _is_deepseek_v4(target) or _is_deepseek_v4(draft):
        which = args.model if _is_deepseek_v4(target) else args.draft_model
        raise ConfigError("--draft-model", args.draft_model,
                          f"DeepSeek-V4 ({which}) is not planned with a separate draft model: it drafts with its own "
                          "MTP layers, cached in its own pools (plan them with -D, without --draft-model)")
    if args.max_draft_len == 0:
        raise ConfigError("--draft-model", args.draft_model, "needs -D/--max-draft-len >= 1 (the draft tokens it "
                                                             "proposes a step); with -D 0 it never runs")
    _check_layers("--draft-model", args.draft_model, draft, args.max_draft_len)
    _check_draft_is_smaller(args, target, draft)
    positions = _positions(draft)
    if positions is not None and args.max_seq_len + args.max_draft_len > positions:
        raise ConfigError("-S/--max-seq-len", args.max_seq_len,
                          f"must be <= {positions - args.max_draft_len} with -D {args.max_draft_len}: the draft model "
                          f"(--draft-model {args.draft_model}) holds a request and its drafts in max_position_embeddings="
                          f"{positions} positions")


def _kv_width(config: dict | None) -> int | None:
    """KV values a token (layers x KV heads x head width) read from a config, or None where a key is missing."""
    cfg = config or {}
    cfg = cfg.get("text_config") or cfg if "num_hidden_layers" not in cfg else cfg
    layers, heads = cfg.get("num_hidden_layers"), cfg.get("num_attention_heads")
    kv = cfg.get("num_key_value_heads") or heads
    width = cfg.get("head_dim") or (cfg.get("hidden_size") // heads if isinstance(cfg.get("hidden_size"), int)
                                    and isinstance(heads, int) and heads > 0 else None)
    values = (layers, kv, width)
    return layers * kv * width if all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in values) \
        else None


def _check_draft_is_smaller(args, target: dict | None, draft: dict | None) -> None:
    """A draft model that caches more a token than its target is the two options swapped (a draft must be cheaper
    than the model it drafts for, or speculation costs more than it saves)."""
    from .errors import ConfigError

    t, d = _kv_width(target), _kv_width(draft)
    if t is not None and d is not None and d > t:
        raise ConfigError("--draft-model", args.draft_model, f"caches {d:,} KV values a token, more than the target "
                          f"{args.model}'s {t:,}: a draft must be the smaller model (--model and --draft-model swapped?)")
