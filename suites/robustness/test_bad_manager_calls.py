"""Bad calls to manager operations: each raises ``ConfigError`` naming the argument, and changes nothing.

Every case runs on V1, V2 and DeepSeek-V4 (``_state.make_manager``); the snapshot covers held requests, their
capacities, histories and block tables, and each pool's free list. The first cases are the ones the bad-input
sweep found leaking or silently accepted: a dummy whose token count is not a number (the first dummy of the
call stayed held), a dummy longer than ``max_seq_len``, a negative draft reservation, and a string passed as
the list of request ids.
"""

from __future__ import annotations

import pytest

import kvcm

from _robustness import KINDS, MAX_SEQ_LEN, make_manager, snapshot

# (case id, call on a manager holding request "held" at capacity 40, history 40, error fragment)
CASES = [
    ("dummy_second_token_num_str", lambda m: m.add_dummy_requests(["a", "b"], token_nums=[10, "x"]),
     "token_nums='x' is invalid: must be an integer"),
    ("dummy_second_token_num_float", lambda m: m.add_dummy_requests(["a", "b"], token_nums=[10, 2.5]),
     "token_nums=2.5 is invalid: must be an integer"),
    ("dummy_second_token_num_zero", lambda m: m.add_dummy_requests(["a", "b"], token_nums=[10, 0]),
     "token_nums=0 is invalid: must be >= 1 and <= 256"),
    ("dummy_longer_than_max_seq_len", lambda m: m.add_dummy_requests(["a"], token_nums=[1000]),
     f"token_nums=1000 is invalid: must be >= 1 and <= {MAX_SEQ_LEN} (max_seq_len)"),
    ("dummy_negative_reserve", lambda m: m.add_dummy_requests(["a"], token_nums=[40], is_gen=True,
                                                              kv_reserve_draft_tokens=-20),
     "kv_reserve_draft_tokens=-20 is invalid: must be >= 0"),
    ("dummy_negative_drafts", lambda m: m.add_dummy_requests(["a"], max_num_draft_tokens=-1),
     "max_num_draft_tokens=-1 is invalid: must be >= 0"),
    ("dummy_ids_string", lambda m: m.add_dummy_requests("abc"), "request_ids='abc' is invalid: must be a list"),
    ("dummy_ids_int", lambda m: m.add_dummy_requests(5), "request_ids=5 is invalid: must be a list"),
    ("dummy_ids_duplicate", lambda m: m.add_dummy_requests(["a", "b", "a"]), "request_ids='a' is invalid: must be "
                                                                             "distinct"),
    ("dummy_id_held", lambda m: m.add_dummy_requests(["a", "held"]), "request_ids='held' is invalid: is already held"),
    ("dummy_id_unhashable", lambda m: m.add_dummy_requests(["a", ["b"]]), "request_id=['b'] is invalid: must be "
                                                                         "hashable"),
    ("dummy_token_nums_short", lambda m: m.add_dummy_requests(["a", "b"], token_nums=[3]),
     "token_nums=1 is invalid: must have one entry per request id (2)"),
    ("dummy_token_nums_string", lambda m: m.add_dummy_requests(["a", "b"], token_nums="12"),
     "token_nums='12' is invalid: must be a list"),
    ("dummy_is_gen_string", lambda m: m.add_dummy_requests(["a"], is_gen="yes"), "is_gen='yes' is invalid"),
    ("context_negative_start", lambda m: m.begin_context_chunk("n", -1, 4, 4), "start=-1 is invalid: must be >= 0"),
    ("context_float_tokens", lambda m: m.begin_context_chunk("n", 0, 4.0, 4), "num_tokens=4.0 is invalid: must be "
                                                                             "an integer"),
    ("context_unhashable_id", lambda m: m.begin_context_chunk({}, 0, 4, 4), "request_id={} is invalid"),
    ("context_negative_draft", lambda m: m.begin_context_chunk("n", 0, 4, 4, draft_len=-2), "draft_len=-2"),
    ("generation_negative_draft", lambda m: m.begin_generation("held", num_draft=-3), "num_draft=-3 is invalid"),
    ("generation_str_draft", lambda m: m.begin_generation("held", num_draft="2"), "num_draft='2' is invalid"),
    ("end_generation_accepted_above_drafts", lambda m: m.end_generation("held", 42, num_draft=1, num_accepted=2),
     "num_accepted=2 is invalid: must be >= 0 and <= 1 (num_draft)"),
    ("end_context_history_bool", lambda m: m.end_context_chunk("held", True), "history=True is invalid"),
    ("free_unknown", lambda m: m.free_resources("nobody"), "no request 'nobody'"),
    ("available_batch_size_zero", lambda m: m.get_num_available_tokens(token_num_upper_bound=64, batch_size=0),
     "batch_size=0 is invalid: must be >= 1"),
    ("available_negative_bound", lambda m: m.get_num_available_tokens(token_num_upper_bound=-1),
     "token_num_upper_bound=-1 is invalid"),
]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("call, fragment", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_call_raises_and_changes_nothing(kind, call, fragment):
    mgr = make_manager(kind)
    before = snapshot(mgr)
    with pytest.raises((kvcm.ConfigError, kvcm.UnknownRequestError)) as info:
        call(mgr)
    assert fragment in str(info.value)
    assert snapshot(mgr) == before


class Boom(Exception):
    pass


@pytest.mark.parametrize("kind", KINDS)
def test_any_exception_while_placing_dummies_releases_the_call(kind, monkeypatch):
    """A failure of any kind on the second dummy (not only a lack of pages) leaves nothing of the call held."""
    mgr = make_manager(kind)
    before = snapshot(mgr)
    place, calls = type(mgr)._place_dummy, []

    def flaky(self, *args):
        calls.append(args)
        if len(calls) == 2:
            raise Boom("second dummy")
        return place(self, *args)

    monkeypatch.setattr(type(mgr), "_place_dummy", flaky)
    with pytest.raises(Boom):
        mgr.add_dummy_requests(["a", "b", "c"], token_nums=[100, 100, 100], is_gen=True)
    assert len(calls) == 2 and snapshot(mgr) == before


@pytest.mark.parametrize("kind", KINDS)
def test_any_exception_in_a_first_context_chunk_forgets_the_request(kind, monkeypatch):
    mgr = make_manager(kind)
    before = snapshot(mgr)
    grow = "_set_tokens" if kind == "v1" else "_resize_or_raise"

    def boom(self, *args):
        raise Boom("grow")

    monkeypatch.setattr(type(mgr), grow, boom)
    with pytest.raises(Boom):
        mgr.begin_context_chunk("new", 0, 10, 10)
    assert snapshot(mgr) == before


@pytest.mark.parametrize("kind", KINDS)
def test_out_of_pages_dummy_call_returns_none_and_changes_nothing(kind):
    mgr = make_manager(kind)
    before = snapshot(mgr)
    many = [f"d{i}" for i in range(4096)]
    assert mgr.add_dummy_requests(many, token_nums=[MAX_SEQ_LEN] * len(many), is_gen=True) is None
    assert snapshot(mgr) == before


@pytest.mark.parametrize("kind", KINDS)
def test_good_calls_still_work(kind):
    """The checks reject only bad values: integer-like ids and counts from numpy-free code paths still pass."""
    mgr = make_manager(kind)
    out = mgr.add_dummy_requests(("a", 7), token_nums=[MAX_SEQ_LEN, 1], is_gen=True, max_num_draft_tokens=2)
    assert [d.request_id for d in out] == ["a", 7] and mgr.has_request(7)
    assert mgr.get_num_available_tokens(token_num_upper_bound=10, batch_size=1) == 10


@pytest.mark.parametrize("kind", KINDS)
def test_a_block_table_the_engine_wrote_to_cannot_free_a_page_twice(kind):
    """An engine that appended to the table ``block_tables`` lent it (vLLM #42571's sliding window listed a block
    again when it re-entered the window) frees the request: the second release of the page is refused with the
    block named, and no pool ever counts more free pages than it has or lists a page twice."""
    mgr = make_manager(kind)
    tpb = mgr.tokens_per_block
    mgr.add_sequence("r", list(range(2 * tpb)))
    mgr.begin_context_chunk("r", 0, 2 * tpb, 2 * tpb)
    mgr.end_context_chunk("r", 2 * tpb)
    mgr.append_tokens("r", [7])
    mgr.begin_generation("r")
    mgr.end_generation("r", 2 * tpb + 2)
    for g, table in enumerate(mgr.block_tables(["r"])[0]):
        table.append(table[-1])
    with pytest.raises(RuntimeError, match="released twice"):
        mgr.free_resources("r")
    for pool in mgr.pools:
        assert pool.num_free + pool.num_reusable <= pool.num_blocks
        assert len(set(pool.free_order())) == len(pool.free_order())
