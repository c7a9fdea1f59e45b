"""The n-gram drafter keeps TensorRT-LLM's pool semantics (``tensorrt_llm/_torch/speculative/ngram.py``,
``NGramPoolManager``; defaults of ``NGramDecodingConfig``): patterns of up to ``max_matching_ngram_size`` tokens
map to the continuations that followed them, learned from prompts and generated tokens; a public pool serves
every request; the oldest (or newest) continuation is proposed; a private pool goes with its request."""

import pytest

from kvcm.engine import LLM, SamplingParams
from kvcm.engine.ngram import NgramDrafter, NgramPool
from kvcm.engine.sequence import Sequence, Status
from kvcm.models import tiny_model

from _prompts import random_prompts


def propose(drafter, rid, tokens, limit=None):
    return drafter.propose(rid, tokens, [], drafter.num_draft if limit is None else limit)


def test_defaults_are_trtllm_defaults():
    d = NgramDrafter(4)
    assert (d.max_n, d.is_public_pool, d.public.is_keep_all, d.public.is_use_oldest) == (2, True, True, True)


def test_longest_known_pattern_wins():
    d = NgramDrafter(3)
    # (2,) -> (9, ...) is known, but so is (1, 2) -> (3, 4, 5): the 2-token pattern decides
    assert propose(d, "a", [1, 2, 3, 4, 5, 7, 2, 9, 8, 1, 2]) == [3, 4, 5]
    assert propose(d, "b", [6, 2]) == [3, 4, 5]      # (2,) alone: its oldest continuation


def test_public_pool_proposes_what_an_earlier_request_generated():
    tail = [40, 41, 42, 43, 44]
    for public, expected in ((True, [42, 43, 44]), (False, [])):
        d = NgramDrafter(3, is_public_pool=public)
        d.propose("first", [1, 2, 3], tail, 3)            # generated tokens, not the prompt, hold the phrase
        assert propose(d, "second", [7, 8, 40, 41]) == expected


@pytest.mark.parametrize("oldest,expected", [(True, [3, 4]), (False, [5, 6])])
def test_use_oldest_or_newest_match(oldest, expected):
    d = NgramDrafter(2, is_use_oldest=oldest)
    assert propose(d, "a", [1, 2, 3, 4, 9, 1, 2, 5, 6, 8, 1, 2]) == expected


def test_a_cut_short_match_grows_and_the_short_one_goes():
    pool = NgramPool(3, 2)
    pool.learn([1, 2, 3], 2)
    assert list(pool.matches[(1, 2)]) == [(3,)]
    pool.learn([1, 2, 3, 4, 5], 2)          # the rescanned tail: (1, 2) now has a full continuation
    assert list(pool.matches[(1, 2)]) == [(3, 4, 5)]
    pool.learn([1, 2, 7, 8, 9], 2)          # another continuation of the same length joins it (keep all)
    assert list(pool.matches[(1, 2)]) == [(3, 4, 5), (7, 8, 9)]


def test_keep_one_replaces_only_with_a_longer_match():
    pool = NgramPool(3, 2, is_keep_all=False)
    pool.learn([1, 2, 3], 2)
    pool.learn([1, 2, 7, 8, 9], 2)
    assert list(pool.matches[(1, 2)]) == [(7, 8, 9)]


def test_learns_each_token_once_plus_the_rescanned_tail():
    """After a call the start index sits ``D + max_n - 1`` tokens before the end (as upstream), so a long
    request's drafting costs a few patterns a step, not its whole text."""
    d = NgramDrafter(4)
    prompt = list(range(100, 160))
    d.propose("r", prompt, [1], 4)
    assert d.start_index["r"] == 61 - (4 + 2 - 1)
    assert propose(d, "r", [], 0) == []                  # no room left: no drafts, nothing learned either


def test_never_drafts_past_max_new_tokens():
    d = NgramDrafter(4)
    seq = Sequence([5, 6, 7, 8, 5, 6], SamplingParams(max_new_tokens=3))
    seq.output_token_ids = [7]
    from kvcm.engine.runner import StepItem
    item = StepItem(seq.request_id, [7, 0, 0, 0, 0], 6, decode=True, num_logits=5)
    d.draft([seq], [item])
    # one more token may follow the draft's (the target's own): 3 - 1 - 1 = 1 draft from the pool, then padding
    assert item.token_ids == [7, 8, 8, 8, 8] and d.num_proposed == 1


def test_private_pool_goes_with_its_request_public_stays():
    seq = Sequence([1, 2, 3, 1, 2], SamplingParams())
    for public in (True, False):
        d = NgramDrafter(2, is_public_pool=public)
        d.propose(seq.request_id, seq.prompt_token_ids, [], 2)
        seq.status = Status.RUNNING
        d.free(seq)                          # a preemption: the request keeps what it learned
        assert seq.request_id in d.start_index
        seq.status = Status.FINISHED
        d.free(seq)
        assert seq.request_id not in d.start_index and not d.private
        assert (len(d.public) > 0) if public else d.public is None


def test_rejects_bad_sizes():
    with pytest.raises(ValueError, match="max_matching_ngram_size=0"):
        NgramDrafter(2, max_matching_ngram_size=0)
    with pytest.raises(ValueError, match="num_draft=0"):
        NgramDrafter(0)


@pytest.mark.parametrize("public", [True, False])
def test_engine_pool_outlives_a_request(public):
    """Through the engine: a request that repeats an earlier one's text drafts from that request's output
    when the pool is public (nearly every draft accepted), and gains nothing when it is private."""
    model = tiny_model("llama", num_hidden_layers=2)[0]
    prompt = random_prompts(5, [12])
    llm = LLM(model, max_draft_len=4, drafter=NgramDrafter(4, is_public_pool=public), max_batch_size=2,
              max_seq_len=128)
    params = SamplingParams(max_new_tokens=24, ignore_eos=True)
    first = llm.generate(prompt, params)
    cold = llm.spec_stats.mean_acceptance_length
    again = llm.generate(prompt, params)
    warm = llm.spec_stats.mean_acceptance_length
    assert again[0].token_ids == first[0].token_ids
    if public:
        assert warm > 3.0 and warm > cold + 1.0, (cold, warm)
    else:
        assert warm == cold


def _reference_add(pool: dict, pattern, match, keep_all: bool) -> None:
    """The pool rule written plainly: scan every match of the pattern (what the indexed pool avoids)."""
    known = pool.get(pattern)
    if known is None or (not keep_all and len(match) > len(known[0])):
        pool[pattern] = [match]
    elif match not in known:
        known[:] = [m for m in known if len(m) >= len(match)] + [match]


@pytest.mark.parametrize("keep_all", [True, False])
def test_indexed_pool_equals_the_plain_rule(keep_all):
    import random
    rng = random.Random(3)
    pool, ref = NgramPool(3, 2, is_keep_all=keep_all), {}
    for _ in range(200):
        tail = [rng.randint(0, 5) for _ in range(rng.randint(2, 9))]
        pool.learn(tail, 2)
        for size in (2, 1):
            for i in range(len(tail) - size):
                _reference_add(ref, tuple(tail[i:i + size]), tuple(tail[i + size:i + size + 3]), keep_all)
    assert {p: list(m) for p, m in pool.matches.items()} == ref


@pytest.mark.parametrize("public,oldest", [(True, True), (True, False), (False, True), (False, False)])
def test_every_configuration_gives_plain_greedy_tokens(public, oldest, greedy_parity):
    """Requests that share phrases, so the pool proposes (often cut short and padded) from other requests' text;
    a small token budget chunks prefills beside verifications. Tokens are exactly plain greedy decoding's."""
    from kvcm.models import hf_generate
    from pytest_kvcm.parity import compare_outputs
    model = tiny_model("llama", num_hidden_layers=2)[0]
    a, b, c = random_prompts(9, [6, 9, 5])
    prompts = [a + b, b + c + a, c + a + b + c, a]
    ref = hf_generate(model, prompts, 20, eos_token_id=[])
    llm = LLM(model, max_draft_len=3, drafter=NgramDrafter(3, is_public_pool=public, is_use_oldest=oldest),
              max_batch_size=3, max_seq_len=128, max_num_tokens=16)
    outs = llm.generate(prompts, SamplingParams(max_new_tokens=20, ignore_eos=True))
    greedy_parity.check(compare_outputs(ref, outs, prompts, names=("hf", "ngram")), model="tiny-llama-2l")
    assert llm.drafter.num_proposed > 0 and not llm.manager.request_ids


def _verification(seq, k):
    from kvcm.engine.runner import StepItem
    return StepItem(seq.request_id, [seq.last_token] + [0] * k, seq.num_tokens - 1, decode=True, num_logits=1 + k)


def test_a_step_without_proposals_is_a_plain_decode():
    d = NgramDrafter(3)
    fresh = Sequence([11, 12, 13], SamplingParams())
    item = _verification(fresh, 3)
    d.draft([fresh], [item])
    assert (item.token_ids, item.num_logits) == ([13], 1)
    # one sequence with a proposal keeps the whole step's shape: the other is padded
    known = Sequence([5, 6, 7, 5, 6], SamplingParams())
    other = Sequence([21, 22], SamplingParams())
    items = [_verification(known, 3), _verification(other, 3)]
    d.draft([known, other], items)
    assert [it.token_ids for it in items] == [[6, 7, 5, 6], [22, 22, 22, 22]]
    assert [it.num_logits for it in items] == [4, 4]


def test_a_plain_step_gives_back_the_slots_reserved_for_drafts():
    """A step the pool had nothing for verifies no drafts but had ``D`` slots reserved: they are rewound like
    rejected drafts, so capacity stays ``D + 1`` ahead of history (kept, they would pile up step after step)."""
    model = tiny_model("llama", num_hidden_layers=2)[0]
    llm = LLM(model, max_draft_len=3, drafter="ngram", trace=True, max_batch_size=1, max_seq_len=128)
    llm.generate(random_prompts(11, [20]), SamplingParams(max_new_tokens=40, ignore_eos=True))
    decodes = [r for r in llm.trace if r.phase == "decode"]
    assert {r.num_new_tokens for r in decodes} == {1, 4}, "meant to have steps with and without proposals"
    assert {r.capacity - r.history for r in decodes} == {1 + 3}
