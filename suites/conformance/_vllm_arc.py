"""Replay ARC traces on vLLM's own policy: run by the vLLM venv's interpreter (``ci/vllm_venv.sh``), which has
``vllm.v1.kv_offload.cpu.policies.arc.ARCCachePolicy``; reads ``{name: [capacity, ops]}`` as JSON on stdin and
prints ``{name: [state after each op]}``. Plain Python beside vLLM: nothing of kvcm is imported, so what it prints
is vLLM's alone.

An op is ``["insert", key]`` (a stored chunk, made ready at once: kvcm's host copy is synchronous), ``["touch",
keys]`` (``touch``), ``["miss", keys]`` (``on_store_miss``), ``["evict", n, protected]``, ``["remove", key]`` or
``["clear"]``; a state is ``{"out": evicted keys or None, "t1", "t2", "b1", "b2": keys in order, "target":
target_t1_size}``. Keys are JSON scalars.
"""

from __future__ import annotations

import json
import sys

from vllm.v1.kv_offload.cpu.policies.arc import ARCCachePolicy
from vllm.v1.kv_offload.cpu.policies.base import ChunkStatus


def replay(capacity: int, ops: list) -> list[dict]:
    policy, states, chunks = ARCCachePolicy(cache_capacity=capacity), [], 0
    for op in ops:
        out = None
        if op[0] == "insert":
            chunk = ChunkStatus(chunks)
            chunks += 1
            policy.insert(op[1], chunk)
            chunk.ref_cnt = 0                      # complete_store: ready to read, evictable
        elif op[0] == "touch":
            policy.touch(op[1], None)
        elif op[0] == "miss":
            policy.on_store_miss(op[1], None)
        elif op[0] == "evict":
            evicted = policy.evict(op[1], set(op[2]))
            out = None if evicted is None else [key for key, _ in evicted]
        elif op[0] == "remove":
            policy.remove(op[1])
        elif op[0] == "clear":
            policy.clear()
        else:
            raise ValueError(f"unknown op {op!r}")
        states.append({"out": out, "t1": list(policy.t1), "t2": list(policy.t2), "b1": list(policy.b1),
                       "b2": list(policy.b2), "target": policy.target_t1_size})
    return states


if __name__ == "__main__":
    traces = json.load(sys.stdin)
    json.dump({name: replay(capacity, ops) for name, (capacity, ops) in traces.items()}, sys.stdout)
