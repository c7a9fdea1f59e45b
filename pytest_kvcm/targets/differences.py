"""The keys an adapter's ``differences = {key: why}`` may declare, what each relaxes, and the record of it.

A declared difference of design relaxes only the assertions its entry names, in the tests that name it; it
never skips a test that checks something else. Every test counts from the target's own page size and free
pages, so a pool of another size runs the same checks; a test is skipped (``require``) only where it cannot run
at all under the key, and the key's entry below names it. Whatever is declared, the refused-allocation checks
run, and each of the planted bugs of ``suites/plugin/test_declaration_matrix.py`` (a matched last prompt token,
a page leaked at free, a refused allocation that keeps a page, ...) is still caught with every key declared, one
at a time and all at once: a maintainer cannot buy a green run with declarations. A key that is not here is
refused when the session starts: a typo, or a key no test reads, would otherwise relax nothing and say nothing.

Every relaxation a test makes is recorded on its report (``user_properties``, so it crosses pytest-xdist); a
relaxed test that fails says which keys were in force and what it expected with and without them, and the run
ends with a "kvcm declared differences" section: the tests relaxed that passed, those relaxed that failed, and
those a key skipped, with the reason. ``python -m pytest_kvcm.contract --keys`` prints this table.
"""

from __future__ import annotations

RELAXED = "kvcm_relaxed"  # the user_properties name of one relaxation

# key -> (the design it declares, what the suites do about it)
KEYS: dict[str, tuple[str, str]] = {
    "exact_pool_size": (
        "the pool is not the size asked (DeepSeek-V4 splits a token quota between pools by a typical step)",
        "the reuse tests count from the pool's own free pages, not the 10 asked; a pool asked one page short of "
        "max_model_len may admit it; one token past the available-tokens answer may fit; the refused growth asks "
        "for max_model_len tokens, not one more than the pool; skips test_target_startup.py, whose every assertion "
        "is about a pool of exactly kvcm's start-up bound or one page short"),
    "free_pages": (
        "free_pages() is not one pool's count of pages a prompt may take (DeepSeek-V4: the smallest of several "
        "pools, each filling at its own rate)",
        "the reuse tests compare no free-page counts (their hits, refusals and cached blocks are checked); "
        "test_failed_allocation_with_a_hit_changes_nothing does not run vLLM's boundary case (filled by the free "
        "count); the available-tokens answer is not compared with the free count (it must fit, as always); skips "
        "test_eviction_takes_the_deepest_block_of_a_prefix_first (its miss is sized by the free count) and the two "
        "side-by-side state machines (every admission and free count compared with kvcm's one pool)"),
    "page_size": (
        "pages are not the size asked (DeepSeek-V4 rounds up to 128 tokens)",
        "the reuse tests cut their prompts at the target's own page size, not the 16 tokens asked"),
    "sliding_window": (
        "why the window's pages are not released as it slides (with releases_window_pages = False)",
        "the reason in test_target_sliding_window.py's skip; the key alone relaxes nothing"),
    "last_prompt_block": (
        "a block-aligned prompt's last block is stored later than the prompt (TensorRT-LLM V1: by the first "
        "decode step, at release as a partial block)",
        "test_failed_allocation_with_a_hit_changes_nothing expects hits of 2 and 5 blocks, not 3 and 6 (the "
        "refusal and its 'nothing changed' are asserted as always); test_block_aligned_prompt_stores_its_last_block "
        "expects a hit of 2 blocks, not 3; test_repeated_block_aligned_prompt expects 4 pages held, 3 cached after"),
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
        "test_eviction_takes_the_deepest_block_of_a_prefix_first expects no hit left once a miss evicts a block of "
        "the prefix; the reuse state machine keeps to steps that evict nothing or are refused"),
    "window_stored_at_release": (
        "sliding-window blocks are stored at release only (TensorRT-LLM V1)",
        "test_hybrid_hit_is_the_shortest_over_its_groups expects no hit while the first request runs"),
    "window_reuse": (
        "the target's block reuse does not cover a sliding-window model (SGLang: another cache class)",
        "skips test_hybrid_hit_is_the_shortest_over_its_groups, the reuse test on a sliding-window model, which "
        "the target cannot build with reuse"),
    "startup_window": (
        "no window bound applies at start-up (every page of a window layer kept, or a pool of its own)",
        "skips test_target_startup.py's window-bound test (no bound to compare)"),
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
    value = [f"{target_name} differs on {key}: {how}", display_id(node), why]  # a list: it crosses xdist as JSON
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


def relaxations(properties) -> list[list[str]]:
    """``[entry, test id, why]`` of every relaxation in a report's ``user_properties``."""
    return [list(value) + [""] * (3 - len(value)) for name, value in properties if name == RELAXED]


def in_force(properties) -> str:
    """The words a failed relaxed test adds to its failure: each key in force, what the test expected with it and
    (after "not") without it."""
    lines = []
    for entry, _, why in relaxations(properties):
        head, _, how = entry.partition(": ")
        lines.append(f"{head}" + (f" (declared: {why})" if why else "") + f"\n    so this test expected: {how}")
    return ("\n".join(lines) + "\nWithout the declaration the test expects kvcm's behaviour (after 'not' above). A "
            "key that does not describe the manager makes a correct manager fail: remove it; if it does, this "
            "failure is a bug of the manager.")


OUTCOMES = ("passed", "failed", "skipped")


def summary(reports) -> dict[str, dict[str, list[str]]]:
    """``outcome -> {"<target> differs on <key>: <how>" -> [test ids]}`` for every relaxation on the reports, in
    run order: ``passed`` (relaxed, and the relaxed checks held), ``failed`` (relaxed, and a check failed) and
    ``skipped`` (a key the test cannot run under, its reason in the entry)."""
    outcome: dict[str, str] = {}
    entries: dict[str, dict[str, None]] = {}
    for report in reports:
        for entry, test, _ in relaxations(getattr(report, "user_properties", ())):
            entries.setdefault(test, {})[entry] = None
            now = "failed" if report.failed else "skipped" if report.skipped else "passed"
            if outcome.get(test) != "failed" and not (now == "passed" and outcome.get(test) == "skipped"):
                outcome[test] = now
    out: dict[str, dict[str, list[str]]] = {kind: {} for kind in OUTCOMES}
    for test, found in entries.items():
        kind = outcome[test]
        for entry in found:   # a skipped test lists the key that skipped it, not what it relaxed before
            if kind != "skipped" or entry.partition(": ")[2].startswith("skipped"):
                out[kind].setdefault(entry, []).append(test)
    return out
