"""Full GSM8K (1,319 questions, 5-shot lm-eval format, greedy, 256 new tokens) with SmolLM2 through the kvcm
engine on V1 and V2, on a CUDA machine that has no ``datasets``: rows come straight from the JSONL files.

    KVCM_GSM8K_DIR=... KVCM_SMOLLM2_GGUF=... python benchmarks/gpu_gsm8k.py [--limit N] [--out results.json]

Prints per version the strict and flexible scores, wall time and tokens/s, whether V1 and V2 completions are
identical, and the reference entry to paste into ``ci/references/gsm8k.yaml``.
"""

import argparse
import json
import os
import time
from pathlib import Path

import torch

import kvcm
from kvcm.engine import LLM
from kvcm.models import load_smollm2
from pytest_kvcm.accuracy import compute_threshold, evaluate_gsm8k, kvcm_generate_fn
from kvcm.versions import NAMES as ALL_VERSIONS

MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"


def rows(path: Path) -> list[dict]:
    from pytest_kvcm.accuracy.gsm8k_rows import gsm8k_rows_or_exit
    return gsm8k_rows_or_exit(path, "KVCM_GSM8K_DIR")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--limit", type=int, default=None)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    if not os.environ.get("KVCM_GSM8K_DIR"):
        raise SystemExit("KVCM_GSM8K_DIR: not set; give the directory of GSM8K's test.jsonl and train.jsonl")
    root = Path(os.environ["KVCM_GSM8K_DIR"])
    test, train = rows(root / "test.jsonl"), rows(root / "train.jsonl")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model, tok = load_smollm2(dtype=torch.float32, device=device)
    report = {"model": MODEL, "device": torch.cuda.get_device_name(0) if device == "cuda" else "cpu",
              "kvcm_versions": {}}
    results = {}
    for kvcm_version in ALL_VERSIONS:
        cfg = kvcm.KvCacheConfig(max_tokens=max(args.batch * 1280, 65536))
        llm = LLM(model, tok, kvcm_version=kvcm_version, kv_cache_config=cfg, max_batch_size=args.batch,
                  max_seq_len=2048, max_num_tokens=8192, device=device)
        fn = kvcm_generate_fn(llm, tok)
        if device == "cuda":
            torch.cuda.synchronize()
        start = time.time()
        res = evaluate_gsm8k(fn, test, fewshot=train, limit=args.limit, batch_size=len(test), progress=False)
        if device == "cuda":
            torch.cuda.synchronize()
        wall = time.time() - start
        ntok = sum(len(tok(s.completion, add_special_tokens=False)["input_ids"]) for s in res.samples)
        results[kvcm_version] = res
        report["kvcm_versions"][kvcm_version] = {"strict": res.strict, "flexible": res.flexible, "score": res.score,
                                       "n": res.num_samples, "wall_s": round(wall, 1),
                                       "completion_tokens_per_s": round(ntok / wall, 1)}
        print(f"{kvcm_version}: strict {res.strict:.2f} flexible {res.flexible:.2f} n={res.num_samples} "
              f"wall {wall:.1f}s ~{ntok / wall:.0f} completion tok/s", flush=True)
    same = sum(a.completion == b.completion for a, b in zip(results["v1"].samples, results["v2"].samples))
    report["v1_v2_identical"] = f"{same}/{results['v1'].num_samples}"
    print(f"V1 vs V2 identical completions: {same}/{results['v1'].num_samples}", flush=True)
    res = results["v2"]
    gate = compute_threshold(res.score, res.num_samples)
    entry = {MODEL: [{"dtype": "float32", "quant_algo": "Q4_1", "accuracy": round(res.score, 3),
                      "num_samples": res.num_samples}]}
    report["reference_entry"] = entry
    report["threshold_at_n"] = {"threshold": gate.threshold, "theta": gate.theta}
    print("reference entry:\n" + json.dumps(entry, indent=2), flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
