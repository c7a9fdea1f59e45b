"""``kvcm plan --host-cache-size GIB [--prefix-tokens T]``: the host tier on paper (docs/semantics.md 11.6, 11.7).

TensorRT-LLM's option is ``KvCacheConfig.host_cache_size`` (bytes); the plan takes GiB, as ``--free-gib`` does.
For each manager: the host pool of every group (V1: ``floor(bytes / block bytes)`` blocks; V2: its host level, the
bytes split between the groups as the GPU level's are) beside the GPU pool, and what a shared prefix set of ``T``
tokens costs with and without the tier when requests visit it in turn (the least recently used prefix next, the
case an LRU cache handles worst): without the tier a set larger than the GPU pool misses on every visit and is
recomputed; with it, a set that fits GPU + host is recomputed never and copied host -> GPU instead.
"""

from __future__ import annotations

from . import versions
from .units import GiB, ceil_div


def add_arguments(p) -> None:
    p.add_argument("--host-cache-size", type=float, default=None, metavar="GIB",
                   help="host memory for V1's host tier in GiB (TensorRT-LLM KvCacheConfig.host_cache_size, in bytes "
                        "there): evicted cached blocks are offloaded there and onboarded on a hit (default: none)")
    p.add_argument("--prefix-tokens", type=int, default=None,
                   help="tokens of a shared prefix set to cost with and without the host tier (default: none)")


def check(args, max_gib: float) -> None:
    from . import validation
    from .errors import ConfigError

    if args.host_cache_size is not None:
        validation.finite("--host-cache-size", args.host_cache_size, 0, max_gib)
    validation.optional_count("--prefix-tokens", args.prefix_tokens, 1)
    if args.prefix_tokens is not None and args.host_cache_size is None:
        raise ConfigError("--prefix-tokens", args.prefix_tokens, "needs --host-cache-size: it costs a prefix set "
                                                                 "with and without the host tier")


def entry(manager, args) -> dict | None:
    """The ``host_tier`` key of one manager's plan (None without ``--host-cache-size``)."""
    if args.host_cache_size is None:
        return None
    host_bytes = int(args.host_cache_size * GiB)
    version = versions.of(type(manager))
    tier = version.host_tier_class
    if tier is None:
        # a manager that refuses host_cache_size says why (DeepSeek-V4: upstream's offload is another thing)
        return {"host_cache_size": host_bytes, "modelled": False, "why": version.no_host_tier}
    tpb = manager.tokens_per_block
    block_bytes = sum(g.bytes_per_block for g in manager.layer_groups)
    gpu = min(g.num_blocks for g in manager.layer_groups)
    figures = tier.plan(manager, host_bytes)        # the tier's own: V1's secondary pool, V2's host level
    host = figures.pop("host_blocks")
    out = {"host_cache_size": host_bytes, "modelled": True, "bytes_per_block": block_bytes,
           "gpu_blocks": gpu, "gpu_tokens": gpu * tpb, "host_blocks": host, "host_tokens": host * tpb, **figures}
    if args.prefix_tokens is not None:
        out["prefix_set"] = prefix_cost(args.prefix_tokens, tpb, gpu, host, block_bytes)
    return out


def prefix_cost(tokens: int, tpb: int, gpu_blocks: int, host_blocks: int, block_bytes: int) -> dict:
    """One visit of every prefix of a ``tokens``-token set, in turn, once the cache is warm."""
    blocks = ceil_div(tokens, tpb)
    fits_gpu, fits_both = blocks <= gpu_blocks, blocks <= gpu_blocks + host_blocks
    onboarded = 0 if fits_gpu or not fits_both else blocks
    return {"tokens": tokens, "blocks": blocks, "bytes": blocks * block_bytes,
            "fits_gpu": fits_gpu, "fits_gpu_and_host": fits_both,
            "recomputed_tokens_without_tier": 0 if fits_gpu else tokens,
            "recomputed_tokens_with_tier": 0 if fits_both else tokens,
            "onboarded_blocks_with_tier": onboarded, "copied_bytes_with_tier": 2 * onboarded * block_bytes}


def lines(m: dict) -> list[str]:
    h = m.get("host_tier")
    if not h:
        return []
    if not h["modelled"]:
        return [f"  host tier ({h['host_cache_size'] / GiB:g} GiB) [--host-cache-size]: not modelled for "
                f"{m['kvcm_version'].upper()}: {h['why']}"]
    head = (f"  host tier [--host-cache-size]: {h['host_blocks']:,} blocks ({h['host_tokens']:,} tokens) of host "
            f"memory beside {h['gpu_blocks']:,} GPU blocks ({h['gpu_tokens']:,} tokens); ")
    if "host_blocks_per_group" in h:      # V2's host level
        out = [head + "every evicted cached page falls to the host level, which evicts its lowest priority first, "
                      "and a hit migrates it back"]
    else:
        out = [head + f"cached blocks at priority >= {h['secondary_offload_min_priority']} are offloaded on eviction "
                      "and onboarded on a hit" + ("" if h["onboard_blocks"] else
                                                  " (onboard_blocks off: nothing is offloaded)")]
    p = h.get("prefix_set")
    if p:
        out.append(f"    a prefix set of {p['tokens']:,} tokens ({p['blocks']:,} blocks, {p['bytes'] / GiB:.2f} GiB), "
                   "each prefix visited in turn:")
        out.append(f"      without the tier: {'fits the GPU pool' if p['fits_gpu'] else 'larger than the GPU pool'}"
                   f", {p['recomputed_tokens_without_tier']:,} tokens recomputed a pass")
        out.append(f"      with the tier: {'fits GPU + host' if p['fits_gpu_and_host'] else 'larger than GPU + host'}"
                   f", {p['recomputed_tokens_with_tier']:,} tokens recomputed, {p['onboarded_blocks_with_tier']:,} "
                   f"blocks onboarded a pass ({p['copied_bytes_with_tier'] / GiB:.2f} GiB copied between the tiers, "
                   "both ways)")
    return out
