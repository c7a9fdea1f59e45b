"""kvcm's start-up rule (kvcm/startup.py): the least pool that serves one request of ``max_model_len``.

Numbers by hand (pages of 16): max_model_len 200 takes cdiv(200, 16) = 13 full-attention pages; a window of 32
with chunks of 16 keeps min(31 + 16, 200) = 47 tokens = 3 pages plus one for the unaligned start = 4 (vLLM's
``SlidingWindowSpec.max_admission_blocks_per_request`` with one batch in flight gives the same).
"""

import pytest

from kvcm import startup
from kvcm.errors import ConfigError
from pytest_kvcm.targets import PoolSpec
from pytest_kvcm.targets.kvcm_targets import KvcmV2Target


def test_request_pages_by_hand():
    assert startup.request_pages(16, 200) == 13
    assert startup.request_pages(16, 200, window=32, max_num_batched_tokens=16) == 4
    assert startup.request_pages(16, 40, window=32, max_num_batched_tokens=64) == 4  # capped by max_model_len: 3 + 1
    assert startup.least_pool(16, 200, windows=(None, 32), reserved_pages=1, max_num_batched_tokens=16) == 18


def test_one_page_short_of_max_model_len_is_refused():
    """vLLM PR #47272: with one page held back, cdiv(max_model_len, page_size) pages are one short."""
    assert startup.accepts(14, 16, 200, reserved_pages=1)
    assert not startup.accepts(13, 16, 200, reserved_pages=1)
    with pytest.raises(ConfigError) as err:
        startup.check(13, 16, 200, reserved_pages=1)
    assert err.value.field == "num_pages" and err.value.value == 13 and "must be >= 14" in err.value.limit


def test_window_bound_is_what_kvcm_v2_holds():
    """The rule is kvcm's own behaviour: a request prefilled in chunks of 16 never holds more
    window pages than ``request_pages`` says, and reaches that many."""
    ps, window, chunk, mml = 16, 32, 16, 200
    target = KvcmV2Target(PoolSpec(num_pages=64, max_model_len=mml, sliding_window=window, max_lookahead=0))
    assert target.allocate("r", chunk // 2)  # later chunks straddle page boundaries: the window's unaligned start
    peak = target.held_pages("r")["window"]
    while target.tokens("r") + chunk <= mml:
        assert target.grow("r", chunk)
        peak = max(peak, target.held_pages("r")["window"])
    assert peak == startup.request_pages(ps, mml, window, chunk)
