"""Time the engine's per-request calls of one kvcm tree (``python _ops_peer.py ROOT VERSION REUSE``), printing JSON.

Run in a subprocess by ``test_manager_ops.py`` so that two trees (this one, and main before block reuse existed)
can be measured back to back in one run: both import as ``kvcm``. Prints each call's median time and the number of
function calls it makes (``seconds``, ``calls``). ``REUSE`` is ``on``, ``off`` or ``absent`` (a
tree whose ``KvCacheConfig`` has no ``enable_block_reuse``).
"""

from __future__ import annotations

import json
import statistics
import sys
import time

TPB, S, BLOCKS = 32, 131072, 1 << 16


def main(root: str, version: str, reuse: str) -> None:
    sys.path.insert(0, root)
    import kvcm
    from kvcm.config import KvCacheConfig
    from kvcm.model_spec import ModelSpec

    assert kvcm.__file__.startswith(root), kvcm.__file__
    kw = {} if reuse == "absent" else {"enable_block_reuse": reuse == "on"}
    mgr = kvcm.create_kv_cache_manager(version, ModelSpec.uniform(2, 1, 16),
                                       KvCacheConfig(max_tokens=BLOCKS * TPB, **kw), max_batch_size=256,
                                       max_seq_len=S, device="meta")
    mgr.begin_context_chunk("filler", 0, BLOCKS // 2 * TPB, BLOCKS // 2 * TPB)

    def context():
        mgr.begin_context_chunk("r", 0, 1023, 1023)
        mgr.end_context_chunk("r", 1023)

    def step():
        mgr.begin_generation("r", num_draft=2)
        mgr.end_generation("r", num_tokens=1025, num_draft=2, num_accepted=0)

    def cycle():
        context()
        mgr.free_resources("r")

    def available():
        mgr.get_num_available_tokens(token_num_upper_bound=S, batch_size=8, max_num_draft_tokens=2)

    def reset():
        if mgr.has_request("r"):
            mgr.free_resources("r")
        context()

    out, calls = {}, {}
    for name, fn, prepare in (("context+free", cycle, None), ("generation resize", step, reset),
                              ("get_num_available_tokens", available, None)):
        calls[name] = _calls(fn, prepare)
        medians = []
        for _ in range(7):
            total = 0.0
            for _ in range(1000):
                if prepare:
                    prepare()
                t0 = time.perf_counter()
                fn()
                total += time.perf_counter() - t0
            medians.append(total / 1000)
        out[name] = statistics.median(medians)
    print(json.dumps({"seconds": out, "calls": calls}))


def _calls(fn, prepare, n: int = 100) -> float:
    """Python and C function calls one ``fn()`` makes, counted over ``n`` calls: the same on any machine and under
    any load, so a path that does more work shows it even where the timings are noise."""
    count = 0

    def profile(frame, event, arg):
        nonlocal count
        if event in ("call", "c_call"):
            count += 1

    for _ in range(n):
        if prepare:
            prepare()
        sys.setprofile(profile)
        fn()
        sys.setprofile(None)
    return (count - n) / n          # less the one call of setprofile(None) itself each time


if __name__ == "__main__":
    main(*sys.argv[1:4])
