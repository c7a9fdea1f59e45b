"""2026's bugs of the lower tier and of transfers in flight: blocks that never reached the host, blocks on both
levels, and aborts while a copy back from the host was on its way (leaks and late copies), put back into kvcm's
host tiers and loads (``kvcm/reuse/host_tier.py``, ``host_level.py``, ``transfers.py``) through their decisions.

Caught by the manager tests of the lower-tier-only mode and of loads in flight (``suites/managers/
test_lower_tier.py``, ``test_transfers.py``), the ported V2 host-level cases (``suites/conformance/
test_v2_host_tier.py``) and the exhaustive explorer's configuration that runs both switches at once.
"""

from __future__ import annotations

from ._registry import defect

_LOWER = "suites/managers/test_lower_tier.py::"
_LOADS = "suites/managers/test_transfers.py::"
_EXPLORER = ("suites/managers/exhaustive/test_exhaustive.py::test_explorer_finds_no_violation"
             "[v1-full+window-tpb2-b4-reuse_copy-ids-r2-h2-lower-async]")
_PARITY = "suites/engine/test_host_tier_parity.py::test_lower_tier_only_equals_hf_with_every_hit_from_the_host"
_EXPLORER_LOWER = ("suites/managers/exhaustive/test_exhaustive.py::test_explorer_finds_no_violation"
                   "[v2-full-tpb2-b4-reuse_on-ids-r2-h2-lower-ev64]")


@defect("v2-evicted-page-dropped", upstream="SGLang #33713 (nodes evicted from the device were pruned instead of "
        "downgraded to their host copy: the host tier's load-back never ran); TensorRT-LLM kv_cache_manager_v2 "
        "_storage_manager.py _prepare_free_slots (an evicted page migrates down a level)",
        story="V2 evicted cached pages out of the cache although the host level had room: no hit ever came back "
              "from host memory",
        catchers=(_LOWER + "test_v2_every_hit_comes_back_from_the_host",
                  "suites/conformance/test_v2_host_tier.py::test_hits_served_from_a_full_host_are_attributed_to_host",
                  _PARITY))
def v2_evicted_page_dropped():
    return {"evicted_page_falls": False}


@defect("lower-tier-keeps-gpu-copy", upstream="SGLang PR #34046 (write-back kept a host value of a component that "
        "stayed resident on the device, exhausting the host pool) / PR #33777 (duplicated host copies)",
        story="the lower-tier-only mode copied each released block to the host and kept its GPU page: the block "
              "was cached on both levels and hits were served from the GPU",
        catchers=(_LOWER + "test_v1_released_blocks_leave_the_gpu",
                  _LOWER + "test_v2_every_hit_comes_back_from_the_host", _EXPLORER_LOWER, _PARITY))
def lower_tier_keeps_gpu_copy():
    return {"demotion_frees_gpu_copy": False}


@defect("abort-frees-pages-under-transfer", upstream="vLLM PR #32255 (finish_requests delays freeing an aborted "
        "WAITING_FOR_REMOTE_KVS request's blocks until finished_recving; quoted in #46283)",
        story="a request aborted while its hit was loading gave its pages back at once: the late copy landed in a "
              "page another request had been given",
        catchers=(_LOADS + "test_an_abort_in_flight_keeps_the_pages_the_copy_writes",
                  _EXPLORER))
def abort_frees_pages_under_transfer():
    return {"abort_waits_for_transfers": False}


@defect("aborted-load-completion-dropped", upstream="vllm-project/vllm-ascend #16662 / PR #16663 (a whitelist "
        "filtered the late load completion out: FINISHED_ABORTED requests kept their blocks and the prefill "
        "instance stopped admitting)",
        story="the completion of an aborted request's load was ignored: its pages stayed held for good",
        catchers=(_LOADS + "test_an_aborted_load_frees_everything_once_it_lands",
                  _EXPLORER))
def aborted_load_completion_dropped():
    return {"aborted_completions_settled": False}


@defect("chunk-runs-before-its-load", upstream="1CatAI/1Cat-vLLM #598 (a host-to-device restore raced with the "
        "compute that used its blocks: restored KV read as zeros); vLLM keeps a receiving request "
        "WAITING_FOR_REMOTE_KVS",
        story="a request whose cached prefix was still being copied back from the host was given its first "
              "context chunk: attention would read pages the copy had not written",
        catchers=(_LOADS + "test_a_loading_request_is_refused_a_chunk",
                  _EXPLORER))
def chunk_runs_before_its_load():
    return {"chunk_waits_for_load": False}


@defect("aborted-request-freed-at-first-copy", upstream="vLLM PR #56089 (fixes #46240: a request aborted with a KV "
        "receive and a send pending was freed by the first completion; the second asserted on a request no longer "
        "there)",
        story="a request aborted while three copies were loading its hit was released when the first landed: the "
              "two still in flight wrote into freed pages",
        catchers=(_LOADS + "test_an_aborted_request_keeps_its_pages_until_its_last_copy_lands",
                  _EXPLORER))
def aborted_request_freed_at_first_copy():
    return {"aborted_freed_after_last_copy": False}
