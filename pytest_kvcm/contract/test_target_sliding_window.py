"""Sliding-window pages are released once they leave the window, and never before the in-flight token's
window is past them (docs/semantics.md 4.1; vLLM's ``SlidingWindowManager.remove_skipped_blocks``)."""

import pytest

from pytest_kvcm.targets import PoolSpec


@pytest.mark.parametrize("window", [32, 40])
def test_window_pages_follow_the_window(kvcm_target, window):
    target = kvcm_target(PoolSpec(num_pages=64, sliding_window=window))
    if not target.releases_window_pages:
        target.differs("sliding_window", "skipped: the window's pages are not released (releases_window_pages)")
        pytest.skip(f"{target.name}: {target.differences.get('sliding_window', 'releases_window_pages is False')}")
    ps, ring = target.page_size, getattr(target, "window_is_ring", False)
    window = getattr(target, "window_tokens", None) or window  # DeepSeek-V4 widens it by the draft length
    assert target.allocate("r", ps)
    for _ in range(8 * ps):
        have = target.tokens("r")
        assert target.grow("r", 1)
        held = target.held_pages("r")
        first = max(0, have + 1 - window)  # oldest position the in-flight token at `have` attends to
        covering = have // ps - first // ps + 1
        assert held["full"] == have // ps + 1, f"{target}: full attention keeps every page"
        if ring:
            assert held["window"] * ps >= min(window, have + 1) and held["window"] <= -(-window // ps)
        else:
            assert held["window"] == covering, (
                f"{target}: at history {have} (window {window}, pages of {ps}) the window spans positions "
                f"{first}..{have} = {covering} pages; {held['window']} held")
