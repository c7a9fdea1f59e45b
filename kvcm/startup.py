"""kvcm's start-up rule: can a pool of ``num_pages`` serve one request of ``max_model_len`` tokens?

Engines decide this once, before serving (vLLM's ``check_enough_kv_cache_memory`` over the
``max_memory_usage_bytes`` of every ``KVCacheSpec``; SGLang's ``max_total_num_tokens`` against ``context_len``).
A pool that passes must be able to schedule the longest request alone; one that fails must be refused with the
number it lacks, since an engine that starts on it hangs at 0 tok/s (vLLM PR #47272).

The rule, per request, in pages of ``page_size`` tokens, all groups drawing from one pool:

* a full-attention group keeps every page: ``ceil(max_model_len / page_size)``;
* a sliding-window group keeps the last ``window - 1`` computed tokens plus the tokens of **one** batch in
  flight for that request (at most ``max_num_batched_tokens``), never more than ``max_model_len``, plus one page
  because a window seldom starts on a page boundary: ``ceil(min(window - 1 + chunk, max_model_len) / ps) + 1``.
  One batch, not one per concurrent step: a request's next chunk is not scheduled before its previous one
  settles, so its window cannot hold two chunks at once (vLLM issue #49878 discusses the two-batch bound that
  vLLM PR #47728 introduced for async scheduling);
* the pool holds back ``reserved_pages`` from every request (vLLM's null block, SGLang's padding page 0), which
  no request can use (the policy's ``startup_usable_pages``, ``kvcm.policy``).
"""

from __future__ import annotations

from .errors import ConfigError
from .policy import Decisions, resolve, rule
from .units import ceil_div


def request_pages(page_size: int, max_model_len: int, window: int | None = None,
                  max_num_batched_tokens: int | None = None) -> int:
    """Pages one request of ``max_model_len`` tokens holds at its peak in one layer group."""
    full = ceil_div(max_model_len, page_size)
    if window is None:
        return full
    chunk = max_model_len if max_num_batched_tokens is None else max_num_batched_tokens
    return ceil_div(min(window - 1 + chunk, max_model_len), page_size) + 1


def needed_pages(page_size: int, max_model_len: int, windows=(None,), max_num_batched_tokens: int | None = None) -> int:
    """Usable pages one ``max_model_len`` request needs over all its groups (``None`` in ``windows``: full)."""
    return sum(request_pages(page_size, max_model_len, w, max_num_batched_tokens) for w in windows)


def accepts(num_pages: int, page_size: int, max_model_len: int, *, windows=(None,), reserved_pages: int = 0,
            max_num_batched_tokens: int | None = None, policy=None) -> bool:
    """True when a pool of ``num_pages`` (reserved pages included) can serve one ``max_model_len`` request
    (``policy``: None, the active one)."""
    need = needed_pages(page_size, max_model_len, windows, max_num_batched_tokens)
    return resolve(policy).startup_usable_pages(num_pages, reserved_pages) >= need


def check(num_pages: int, page_size: int, max_model_len: int, *, windows=(None,), reserved_pages: int = 0,
          max_num_batched_tokens: int | None = None) -> None:
    """Raise ``ConfigError`` naming ``num_pages`` and the least pool that serves one ``max_model_len`` request."""
    if accepts(num_pages, page_size, max_model_len, windows=windows, reserved_pages=reserved_pages,
               max_num_batched_tokens=max_num_batched_tokens):
        return
    need = needed_pages(page_size, max_model_len, windows, max_num_batched_tokens)
    raise ConfigError("num_pages", num_pages,
                      f"must be >= {need + reserved_pages} to serve one request of max_model_len={max_model_len} "
                      f"({need} pages of {page_size} tokens over {len(tuple(windows))} group(s), plus "
                      f"{reserved_pages} held back)")


def least_pool(page_size: int, max_model_len: int, *, windows=(None,), reserved_pages: int = 0,
               max_num_batched_tokens: int | None = None) -> int:
    """The smallest ``num_pages`` that ``accepts`` (reserved pages included)."""
    return needed_pages(page_size, max_model_len, windows, max_num_batched_tokens) + reserved_pages


# ---- the decisions made here (kvcm.policy: a defect replaces one for a manager or a run) ----------------
class StartupDecisions(Decisions):
    SUBSYSTEM = "start-up check"

    @rule("the pages of a pool that a request can be given: all of them less those the engine holds back from "
          "every request (vLLM PR #47272: the start-up check counted the null block as usable, so a pool of exactly "
          "cdiv(max_model_len, block_size) blocks passed and a max_model_len request never scheduled)")
    def startup_usable_pages(num_pages: int, reserved_pages: int) -> int:
        return num_pages - reserved_pages
