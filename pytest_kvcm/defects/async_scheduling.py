"""Overlapped (asynchronous) scheduling: the engine prepares step n + 1 before it has read step n's tokens.

What it may not know then is whether a token stopped a request; what it does know, it must use.
"""

from __future__ import annotations


from ._registry import defect


@defect("async-scheduling-past-max-tokens",
        upstream="vLLM PR #27922 ([AsyncScheduling] Don't schedule past request max_tokens)",
        story="with async scheduling, a request that had reached max_tokens was scheduled for one more step: "
              "its pages held a step longer and a forward computed a token that was thrown away",
        catchers=("suites/engine/test_overlap.py::test_no_step_past_a_length_limit",))
def async_scheduling_past_max_tokens():
    """The length limit is no longer applied when a step is committed, only when its tokens are read."""
    return {"retire_at_commit": lambda num_outputs, max_new_tokens, num_tokens, max_seq_len: False}
