"""The stop-string check decodes a sequence's tail only when its new token can end a stop string
(``kvcm/engine/stop_strings.py``); it must stop exactly where decoding every tail would.

Checked on the two real tokenizer kinds the project serves: SmolLM2's byte-level BPE and Gemma 3's SentencePiece
with byte fallback, over text that holds the stop strings in many splits (GSM8K few-shot answers, the stop
strings glued to words and spaces, multi-byte characters) and over random token ids.
"""
from __future__ import annotations

import random

import pytest

from kvcm.engine.stop_strings import StopStrings
from kvcm.models import ModelNotInstalled

STOPS = ("Question:", "</s>", "<|im_end|>")
WITH_NON_ASCII = ("Question:", "答案", "é")

TEXT = ("Question: Natalia sold clips to 48 of her friends in April.\nAnswer: 48 / 2 = 24 clips. #### 72\n\n"
        "Question:Question:: </s></s><|im_end|> Quest ion: café 答案：72 naïve Question\n:"
        "<|im_end|>\n\nQuestion: x</s")


def _tokenizer(name: str):
    from transformers import AutoTokenizer
    try:
        if name == "smollm2":
            from kvcm.models.smollm2 import smollm2_cache_dir
            path = smollm2_cache_dir()
        else:
            from kvcm.models.gemma3 import gemma3_cache_dir
            path = gemma3_cache_dir()
    except ModelNotInstalled as exc:
        pytest.skip(str(exc))
    return AutoTokenizer.from_pretrained(str(path))


def _every_tail(tok, stops, output: list[int], pos: int) -> str | None:
    """The check without the shortcut: decode the window after every token."""
    longest = max(len(s) for s in stops)
    tail = tok.decode(output[max(0, pos + 1 - (longest + 8)):pos + 1])
    return next((s for s in stops if s in tail), None)


def _first_stop(find, output: list[int]) -> tuple[int, str] | None:
    for pos in range(len(output)):
        found = find(output, pos)
        if found is not None:
            return pos, found
    return None


@pytest.fixture(scope="module", params=["smollm2", "gemma3"])
def tok(request):
    return _tokenizer(request.param)


def _outputs(tok) -> list[list[int]]:
    rng = random.Random(0)
    ids = tok(TEXT, add_special_tokens=False).input_ids
    outs = [ids[i:] for i in range(0, len(ids), 3)]                 # every stop string in many positions
    specials = [t for t in tok.all_special_ids]
    vocab = len(tok)
    for _ in range(60):                                             # random ids with real pieces spliced in
        out = [rng.randrange(vocab) for _ in range(rng.randrange(5, 40))]
        k = rng.randrange(len(ids) - 8)
        out[rng.randrange(len(out)):0] = ids[k:k + rng.randrange(2, 8)] + rng.sample(specials, 1)
        outs.append(out)
    return outs


@pytest.mark.parametrize("stops", [STOPS, WITH_NON_ASCII], ids=["ascii-ends", "non-ascii-ends"])
def test_the_shortcut_stops_where_decoding_every_tail_stops(tok, stops):
    check = StopStrings(tok)
    outs = _outputs(tok)
    expected = [_first_stop(lambda o, p: _every_tail(tok, stops, o, p), out) for out in outs]
    got = [_first_stop(lambda o, p: check.find(stops, o, p), out) for out in outs]
    assert got == expected
    assert sum(e is not None for e in expected) >= len(outs) // 4     # the text does stop, often


def test_the_shortcut_decodes_few_tails(tok):
    """Most tokens cannot end ``Question:``: the window is decoded for a few of them only (the point of it)."""
    decoded = []

    class Counting:
        def decode(self, ids, **kw):
            decoded.append(len(ids))
            return tok.decode(ids, **kw)

    check = StopStrings(Counting())
    out = tok("Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
              "How many clips did Natalia sell altogether in April and May?", add_special_tokens=False).input_ids
    for pos in range(len(out)):
        assert check.find(STOPS, out, pos) is None
    windows = sum(n > 1 for n in decoded)
    assert windows <= 2, f"{windows} windows decoded for {len(out)} tokens"
