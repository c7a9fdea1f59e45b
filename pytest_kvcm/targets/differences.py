"""The keys an adapter's ``differences = {key: why}`` may declare, what each relaxes, and the record of it.

A declared difference of design relaxes only the assertions its entry names, in the tests that name it; it
never skips a test that checks something else. Whatever is declared, the refused-allocation checks
(``test_refused_allocation_and_growth_change_nothing``, ``test_failed_allocation_with_a_hit_changes_nothing``)
run: a maintainer cannot buy a green run by losing "a refused allocation changes nothing"
(``suites/plugin/test_declared_differences.py`` proves it with every key declared at once). A key that is not
here is refused when the session starts: a typo, or a key no test reads, would otherwise relax nothing and say
nothing.

Every relaxation a test makes is recorded on its report (``user_properties``, so it crosses pytest-xdist) and
the run ends with a "kvcm declared differences" section listing each test, the target, the key and how the
test was relaxed.
"""

from __future__ import annotations

RELAXED = "kvcm_relaxed"  # the user_properties name of one relaxation

# key -> (the design it declares, what the suites do about it)
KEYS: dict[str, tuple[str, str]] = {
    "exact_pool_size": (
        "the pool holds at least the pages asked, not exactly (DeepSeek-V4 splits a token quota between pools)",
        "skips the tests whose every assertion counts the pages of a pool of an exact size: max_model_len "
        "admission, the available-tokens boundary, the two side-by-side state machines, start-up, and the reuse "
        "tests that pin vLLM's counts on 10 pages; the refused-allocation checks still run, on the target's own "
        "free count"),
    "free_pages": (
        "free_pages() is not one pool's count of pages a prompt may take (DeepSeek-V4: the smallest of several "
        "pools, each filling at its own rate)",
        "test_failed_allocation_with_a_hit_changes_nothing does not run vLLM's boundary case (filled by the free "
        "count); its refusal of a prompt longer than the pool, with a hit, runs as always"),
    "page_size": (
        "pages are not the size asked (DeepSeek-V4 rounds up to 128 tokens)",
        "skips test_hybrid_hit_is_the_shortest_over_its_groups, whose prompts are cut in 16-token blocks"),
    "sliding_window": (
        "why the window's pages are not released as it slides (with releases_window_pages = False)",
        "the reason in test_target_sliding_window.py's skip; the key alone relaxes nothing"),
    "last_prompt_block": (
        "a block-aligned prompt's last block is stored later than the prompt (TensorRT-LLM V1: by the first "
        "decode step, at release as a partial block)",
        "test_failed_allocation_with_a_hit_changes_nothing expects hits of 32 and 80 tokens, not 48 and 96 (the "
        "refusal and its 'nothing changed' are asserted as always); test_block_aligned_prompt_stores_its_last_block "
        "expects a hit of 32, not 48; test_repeated_block_aligned_prompt expects 4 pages held, 3 cached after"),
    "duplicate_blocks": (
        "a block recomputed under the last-token rule becomes a second cached copy of its key (vLLM: block ids "
        "never change)",
        "test_repeated_block_aligned_prompt expects 4 pages held while both run and 4 cached after release"),
    "private_recomputed_block": (
        "a block recomputed under the last-token rule stays the request's private page and is freed at release "
        "(the cached copy is kept, the duplicate never cached)",
        "test_repeated_block_aligned_prompt expects 4 pages held while both run and 3 cached after release"),
    "partial_blocks_cached": (
        "a partial last block is never cached (vLLM, SGLang)",
        "test_prefill_hit_shares_pages_and_cached_blocks_count_as_free also checks that exactly 3 blocks are "
        "cached (it asserts at least 3 otherwise)"),
    "whole_node_eviction": (
        "eviction takes whole radix nodes, not block by block (SGLang's RadixCache)",
        "test_eviction_takes_the_deepest_block_of_a_prefix_first expects no hit left once a miss needs more than "
        "the 7 unused pages; the reuse state machine keeps to steps that evict nothing or are refused"),
    "window_stored_at_release": (
        "sliding-window blocks are stored at release only (TensorRT-LLM V1)",
        "test_hybrid_hit_is_the_shortest_over_its_groups expects no hit while the first request runs"),
    "window_reuse": (
        "the target's block reuse does not cover a sliding-window model (SGLang: another cache class)",
        "skips test_hybrid_hit_is_the_shortest_over_its_groups, the reuse test on a sliding-window model"),
    "startup_window": (
        "no window bound applies at start-up (every page of a window layer kept, or a pool of its own)",
        "skips test_target_startup.py's window-bound test"),
    "startup_window_chunk": (
        "the window pool's start-up floor does not grow with the chunk (SGLang's validate_swa_pool_size)",
        "test_target_startup.py allows the window pool one page below kvcm's bound when the chunk is > 1"),
    "reuse": (
        "why the target has no block reuse",
        "the reason in the 'has no block reuse' skip; the key alone relaxes nothing"),
}

# Documented for the reader of an adapter; no test reads them, so they relax nothing.
NOTES: dict[str, str] = {
    "units": "pages counted in other units (transformers' sectors)",
    "window": "the sliding window is not the one asked (DeepSeek-V4: W + max_draft_len)",
    "lookahead": "lookahead slots asked for some other way (as more tokens)",
    "max_model_len": "what happens past max_model_len (the suites never step past it)",
    "failed_allocation": "what a refused allocation may still do (vLLM releases out-of-window pages)",
    "shared_pool": "every layer group draws from one pool",
}


def unknown_keys(differences: dict) -> list[str]:
    return [k for k in differences if k not in KEYS and k not in NOTES]


def record(node, target_name: str, key: str, why: str, how: str) -> None:
    """Put one relaxation on the running test's report (once per test, target and key)."""
    if node is None:
        return
    value = [f"{target_name} differs on {key}: {how}", display_id(node)]  # a list: it crosses xdist as JSON
    if (RELAXED, value) not in node.user_properties:
        node.user_properties.append((RELAXED, value))


def display_id(node) -> str:
    """The node id, or ``module::name`` where pytest's has no file part: a test run with ``--pyargs`` from an
    installed package outside the rootdir has ids like ``::test_x[mine]``."""
    nodeid = node.nodeid
    module = getattr(getattr(node, "module", None), "__name__", None)
    if module and (nodeid.startswith("::") or nodeid.startswith("..") or "site-packages" in nodeid):
        return f"{module}::{node.name}"
    return nodeid


def summary(reports) -> dict[str, list[str]]:
    """``"<target> differs on <key>: <how>" -> [test ids]`` for every relaxation on the reports, in run order."""
    groups: dict[str, dict[str, None]] = {}
    for report in reports:
        for name, value in getattr(report, "user_properties", ()):
            if name == RELAXED:
                entry, test = value
                groups.setdefault(entry, {})[test] = None
    return {entry: list(ids) for entry, ids in groups.items()}
