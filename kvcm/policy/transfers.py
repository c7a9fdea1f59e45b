"""Transfers in flight: host-tier hits loaded back asynchronously (``KvCacheConfig.async_onboard``,
``kvcm/reuse/transfers.py``), and what an abort does while one is on its way."""

from __future__ import annotations

from ._decisions import Decisions, setting


class TransferDecisions(Decisions):
    SUBSYSTEM = "transfers in flight"

    abort_waits_for_transfers = setting(
        True, "whether a request freed while its load is in flight keeps its pages until the load completes (vLLM "
        "PR #32255, quoted in #46283: finish_requests delays freeing a WAITING_FOR_REMOTE_KVS request's blocks until "
        "finished_recving); freed at once, the late copy wrote into pages another request had been given")

    aborted_completions_settled = setting(
        True, "whether the completion of an aborted request's load frees that request's pages (vllm-ascend #16662 / "
        "PR #16663: a whitelist of live requests filtered out the late completion, and FINISHED_ABORTED requests "
        "kept their blocks until the instance stopped admitting)")

    aborted_freed_after_last_copy = setting(
        True, "whether an aborted request whose copies land over several completions is released only once the "
        "last one has landed (vLLM PR #56089, issue #46240: with a receive and a send pending, the first completion "
        "freed the request and the second found it gone); released at the first, the copies still in flight wrote "
        "into freed pages")

    chunk_waits_for_load = setting(
        True, "whether a request whose cached prefix is still being loaded from the host is refused a context chunk "
        "(vLLM keeps it WAITING_FOR_REMOTE_KVS until the load completes; 1CatAI/1Cat-vLLM #598: a restore raced with "
        "the compute that used its blocks and the restored KV read as zeros)")
