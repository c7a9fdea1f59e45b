"""Answer extraction and normalisation, as lm-eval's gsm8k filters (strict-match, flexible-extract)."""

import pytest

from pytest_kvcm.accuracy import extract_answer, normalize
from pytest_kvcm.accuracy.gsm8k import INVALID, STOP_STRINGS, target_answer, truncate_at_stop


@pytest.mark.parametrize("text,strict,flexible", [
    ("She has 3 + 4 = 7 apples.\n#### 7", "7", "7"),
    ("#### 1,234", "1234", "1234"),
    ("It costs $5.\n#### $5", INVALID, "5"),  # strict needs a digit right after '#### '
    ("#### -12", "-12", "-12"),
    ("#### 3.50", "3.50", "3.50"),
    ("#### 18.", "18", "18"),  # trailing period dropped
    ("So 2 + 2 = 4 and the total is 9.", INVALID, "9"),  # last number, trailing '.' dropped
    ("The answer is 1,000,000 dollars", INVALID, "1000000"),
    ("#### 5\nThen 6", "5", "6"),  # strict: first '#### '; flexible: last number
    ("#### 5\n#### 6", "5", "6"),
    ("no numbers here", INVALID, INVALID),
    ("x = 7", INVALID, "7"),  # a single digit only matches the second alternative
    ("spent $12", INVALID, "12"),
    ("a 3-step plan costs 40", INVALID, "40"),
])
def test_strict_and_flexible(text, strict, flexible):
    assert extract_answer(text, "strict") == strict
    assert extract_answer(text, "flexible") == flexible


def test_normalize_like_lm_eval():
    assert normalize("$1,234.") == "1234"
    assert normalize("Reasoning...\n#### 42") == "42"
    assert normalize(" 7 ") == "7"
    assert normalize("3.5") == "3.5"  # only a *trailing* '.' goes
    assert target_answer("12 * 2 = <<12*2=24>>24\n#### 24") == "24"


def test_bad_mode_is_named():
    with pytest.raises(ValueError, match="'loose'"):
        extract_answer("1", "loose")


def test_stop_strings_are_lm_evals_until():
    assert STOP_STRINGS == ("Question:", "</s>", "<|im_end|>")
    assert truncate_at_stop(" 3 + 4 = 7\n#### 7\n\nQuestion: next one") == " 3 + 4 = 7\n#### 7\n\n"
    assert truncate_at_stop("#### 7<|im_end|>junk</s>") == "#### 7"
    assert truncate_at_stop("#### 7") == "#### 7"
