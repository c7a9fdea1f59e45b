"""``kvcm plan``: size a model's KV cache on paper, the way an engine would at start-up.

No GPU and no weights: a model config, a memory budget and the engine's limits in, and out the estimation
cache, the final pools, their constraints, max tokens, max concurrency and the CUDA-graph warmup plan.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from .config import KvCacheConfig
from .deepseek_v4 import DeepseekV4Spec
from .errors import KvcmError
from .estimation import build_with_estimation
from .model_spec import ModelSpec

DEFAULT_MODEL = "qwen3-0.6b"
GiB = 2**30
CONFIGS = Path(__file__).parent / "configs"


def embedded_models() -> list[str]:
    return sorted(p.stem for p in CONFIGS.glob("*.json"))


def load_model(name: str):
    """An embedded config name, or a path to a ``config.json``."""
    path = Path(name)
    if path.is_file():
        cfg = json.loads(path.read_text())
    elif name in embedded_models():
        cfg = json.loads((CONFIGS / f"{name}.json").read_text())
    else:
        raise SystemExit(f"kvcm plan: --model {name!r} is neither a file nor an embedded config "
                         f"({', '.join(embedded_models())})")
    if cfg.get("model_type") == "deepseek_v4":
        return DeepseekV4Spec.from_hf_config(cfg)
    return ModelSpec.from_hf_config(cfg)


def max_concurrency(manager, seq_len: int) -> int:
    """Requests of ``seq_len`` tokens (all but the last computed) that fit at once."""
    tpb = manager.tokens_per_block
    counts = []
    for g in manager.layer_groups:
        need = g.blocks_needed(seq_len, seq_len - 1, tpb) if manager.version == "v2" else -(-seq_len // tpb)
        counts.append(g.num_blocks // max(need, 1))
    return min(counts)


def plan(args) -> dict:
    model = load_model(args.model)
    tpb = args.tpb or (128 if isinstance(model, DeepseekV4Spec) else 32)
    cfg = KvCacheConfig(tokens_per_block=tpb, max_tokens=args.max_tokens,
                        max_gpu_total_bytes=None if args.max_gpu_total_gib is None else int(args.max_gpu_total_gib * GiB),
                        free_gpu_memory_fraction=args.fraction, dtype=args.dtype)
    versions = ["v1", "v2"] if args.version == "both" else [args.version]
    if isinstance(model, DeepseekV4Spec):
        versions = ["v2"]
    out = {"model": args.model, "free_memory_bytes": int(args.free_gib * GiB), "max_batch_size": args.max_batch_size,
           "max_seq_len": args.max_seq_len, "max_num_tokens": args.max_num_tokens, "max_draft_len": args.max_draft_len,
           "managers": []}
    for version in versions:
        entry = {"version": version}
        try:
            est = build_with_estimation(version, model, cfg, max_batch_size=args.max_batch_size,
                                        max_seq_len=args.max_seq_len, max_num_tokens=args.max_num_tokens,
                                        max_draft_len=args.max_draft_len, num_extra_kv_tokens=args.extra_kv_tokens,
                                        device="meta", free_memory_bytes=int(args.free_gib * GiB),
                                        two_model=args.two_model)
        except KvcmError as exc:
            entry["error"] = f"{type(exc).__name__}: {exc}"
            out["managers"].append(entry)
            continue
        final = est.manager
        entry.update(estimation=est.estimation, final=final.describe(),
                     max_concurrency=max_concurrency(final, args.max_seq_len),
                     warmup=[w.as_dict() for w in est.warmups])
        out["managers"].append(entry)
    return out


def _gib(n: int) -> str:
    return f"{n / GiB:.2f} GiB"


def render(result: dict) -> str:
    lines = [f"model {result['model']}: free memory {_gib(result['free_memory_bytes'])}, B={result['max_batch_size']} "
             f"S={result['max_seq_len']} N={result['max_num_tokens']} D={result['max_draft_len']}"]
    for m in result["managers"]:
        lines.append("")
        lines.append(f"== {m['version']} ==")
        if "error" in m:
            lines.append(f"  {m['error']}")
            continue
        for title, d in (("estimation cache", m["estimation"]), ("final cache", m["final"])):
            lines.append(f"  {title}: budget {_gib(d['budget_bytes'])}, pools {_gib(d['pool_bytes'])}, "
                         f"max tokens {d['max_tokens']}")
            lines.append(f"    {'group':<14}{'window':>8}{'layers':>8}{'blocks':>10}{'bytes/block':>14}{'total':>12}")
            for g in d["groups"]:
                lines.append(f"    {g['name']:<14}{str(g['window'] or '-'):>8}{g['layers']:>8}{g['num_blocks']:>10}"
                             f"{g['bytes_per_block']:>14}{_gib(g['bytes']):>12}")
            for c in d["constraints"]:
                reqs = " + ".join(f"{r['count']}x({r['capacity']},{r['history']})" for r in c["requests"])
                lines.append(f"    constraint {c['name']}: {reqs}")
            if d["typical_step"]:
                reqs = " + ".join(f"{r['count']}x({r['capacity']},{r['history']})" for r in d["typical_step"])
                lines.append(f"    typical step: {reqs}")
        lines.append(f"  max concurrency at S={result['max_seq_len']}: {m['max_concurrency']}")
        for w in m["warmup"]:
            lines.append(f"  warmup ({w['cache']}): {w['planned']} planned, {w['captured']} captured, "
                         f"{len(w['skipped'])} skipped")
            lines += [f"    skipped bs={s['batch_size']} draft={s['draft_len']}: {s['reason']}" for s in w["skipped"]]
    return "\n".join(lines)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=DEFAULT_MODEL, help=f"embedded config ({', '.join(embedded_models())}) or a "
                                                          "config.json path")
    p.add_argument("--version", choices=["v1", "v2", "both"], default="both")
    p.add_argument("--free-gib", type=float, default=80.0, help="free device memory the fraction applies to")
    p.add_argument("--fraction", type=float, default=None, help="free_gpu_memory_fraction (default 0.9)")
    p.add_argument("--max-tokens", type=int, default=None)
    p.add_argument("--max-gpu-total-gib", type=float, default=None)
    p.add_argument("-B", "--max-batch-size", type=int, default=256)
    p.add_argument("-S", "--max-seq-len", type=int, default=8192)
    p.add_argument("-N", "--max-num-tokens", type=int, default=8192)
    p.add_argument("-D", "--max-draft-len", type=int, default=0)
    p.add_argument("-E", "--extra-kv-tokens", type=int, default=0)
    p.add_argument("--two-model", action="store_true", help="two-model speculation: warm up draft 0 too")
    p.add_argument("--tpb", type=int, default=None, help="tokens per block (32; 128 for DeepSeek-V4)")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--json", action="store_true", help="print JSON instead of the table")


def main(args) -> int:
    result = plan(args)
    print(json.dumps(result, indent=2) if args.json else render(result))
    return 1 if any("error" in m for m in result["managers"]) else 0
