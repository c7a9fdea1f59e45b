"""The host's cost of block reuse per request, admission to release, on a few-shot workload, beside another tree.

GSM8K 8-shot gives every prompt the same 1,316-token prefix and then its own question; with 32-token blocks the
prefix ends mid-block, so every admission looks for a partial match among the cached requests' blocks that follow
the last shared full block, one per request cached so far. The engine makes this call between two steps, on the
host the overlapped loop waits for. Each tree runs in its own process (both import as ``kvcm``):

    python benchmarks/admission.py [--against DIR] [--requests 1319]

prints, per manager version, the mean time of ``add_sequence`` + the prefill's capacity calls + the release with
the generated tokens, over all requests, the first 100 and the last 100 (the last ones find the most cached).
"""
from __future__ import annotations

import argparse
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path
from kvcm.versions import NAMES as ALL_VERSIONS

ROOT = Path(__file__).resolve().parents[1]


def measure(root: str, requests: int) -> None:
    sys.path.insert(0, root)
    import kvcm
    from kvcm.config import KvCacheConfig
    from kvcm.engine import reuse
    from kvcm.model_spec import ModelSpec

    assert kvcm.__file__.startswith(root), kvcm.__file__
    rng = random.Random(0)
    shared = [rng.randrange(3, 49000) for _ in range(1316)]
    prompts = [shared + [rng.randrange(3, 49000) for _ in range(65)] for _ in range(requests)]
    for version in ALL_VERSIONS:
        mgr = kvcm.create_kv_cache_manager(version, ModelSpec.uniform(30, 3, 64),
                                           KvCacheConfig(max_tokens=1 << 22, tokens_per_block=32),
                                           max_batch_size=256, max_seq_len=2048, device="meta")
        times = []
        for rid, p in enumerate(prompts):
            t = time.perf_counter()
            start = reuse.admit(mgr, rid, p)
            mgr.begin_context_chunk(rid, start, len(p) - start, len(p))
            mgr.end_context_chunk(rid, len(p))
            reuse.append_generated(mgr, rid, p + list(range(5, 46)), len(p))
            mgr.free_resources(rid)
            times.append(time.perf_counter() - t)
        us = [t * 1e6 for t in times]
        print(f"  {version}: {statistics.mean(us):6.0f} us a request (median {statistics.median(us):4.0f}, slowest "
              f"{max(us):6.0f}); first 100 {statistics.mean(us[:100]):6.0f} us, last 100 {statistics.mean(us[-100:]):6.0f} us",
              flush=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--against", default=None, help="another checkout to measure in turn (e.g. a git worktree)")
    ap.add_argument("--requests", type=int, default=1319)
    ap.add_argument("--root", default=None, help=argparse.SUPPRESS)    # the child process's tree
    args = ap.parse_args(argv)
    if args.root:
        measure(args.root, args.requests)
        return 0
    for root in [str(ROOT)] + ([str(Path(args.against).resolve())] if args.against else []):
        print(root, flush=True)
        subprocess.run([sys.executable, __file__, "--root", root, "--requests", str(args.requests)], check=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
