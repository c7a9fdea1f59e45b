"""``evaluate_gsm8k`` on scripted generate functions: prompt format, few-shot draw, stops, scoring."""

import random

import pytest

from pytest_kvcm.accuracy import evaluate_gsm8k, load_gsm8k
from pytest_kvcm.accuracy.gsm8k import build_prompt, fewshot_indices, target_answer

pytest.importorskip("datasets", reason="the embedded set loads through 'datasets' (extra: hf)")


@pytest.fixture(scope="module")
def data():
    return load_gsm8k()


def oracle(data, wrong_every=0, overshoot=True):
    """Answers every question right (or every ``wrong_every``-th wrong), running past the stop string."""
    truth = {r["question"]: target_answer(r["answer"]) for r in data.test}
    calls = []

    def generate(prompts, max_new_tokens=256, stop=()):
        calls.append((len(prompts), max_new_tokens, tuple(stop)))
        outs = []
        for p in prompts:
            q = p.rsplit("Question: ", 1)[1].rsplit("\nAnswer:", 1)[0]
            ans = truth[q]
            if wrong_every and len(calls) % wrong_every == 0:
                ans = str(int(ans) + 1)
            tail = "\n\nQuestion: what about #### 999" if overshoot else ""
            outs.append(f" Let me think: the total is {ans}.\n#### {ans}{tail}")
        return outs

    generate.calls = calls
    return generate


def test_perfect_model_scores_100_and_stops_are_applied(data):
    gen = oracle(data)
    r = evaluate_gsm8k(gen, data, batch_size=7, progress=False)
    assert (r.strict, r.flexible, r.score, r.num_samples) == (100.0, 100.0, 100.0, 48)
    assert all("999" not in s.completion for s in r.samples)  # truncated at 'Question:'
    assert [c[0] for c in gen.calls] == [7] * 6 + [6]
    assert gen.calls[0][1:] == (256, ("Question:", "</s>", "<|im_end|>"))


def test_wrong_answers_lower_both_filters(data):
    r = evaluate_gsm8k(oracle(data, wrong_every=2), data, batch_size=8, progress=False)  # half the batches wrong
    assert r.strict == r.flexible == 50.0


def test_strict_and_flexible_differ(data):
    def gen(prompts):  # no '####': strict fails, flexible reads the last number
        return [f" so it is {target_answer(next(r['answer'] for r in data.test if r['question'] in p))}."
                for p in prompts]

    r = evaluate_gsm8k(gen, data, limit=5, progress=False)
    assert (r.strict, r.flexible, r.score, r.num_samples) == (0.0, 100.0, 50.0, 5)


def test_prompt_format_is_lm_evals(data):
    seen = []

    def gen(prompts):
        seen.extend(prompts)
        return ["#### 0"] * len(prompts)

    evaluate_gsm8k(gen, data, limit=3, num_fewshot=2, progress=False)
    train = list(data.train)
    idx = fewshot_indices(3, len(train), 2)
    q0 = data.test[0]["question"]
    s0, s1 = train[idx[0][0]], train[idx[0][1]]
    assert seen[0] == (f"Question: {s0['question']}\nAnswer: {s0['answer']}\n\n"
                       f"Question: {s1['question']}\nAnswer: {s1['answer']}\n\n"
                       f"Question: {q0}\nAnswer:")
    assert seen[0] == build_prompt(q0, [s0, s1])
    evaluate_gsm8k(gen, data, limit=1, num_fewshot=0, progress=False)
    assert seen[-1] == f"Question: {q0}\nAnswer:"


def test_fewshot_draw_is_lm_evals_default_sampler():
    """lm-eval: one ``random.Random(1234)``; ``sample(train_docs, k)`` per question, in order."""
    rnd = random.Random(1234)
    docs = [f"doc{i}" for i in range(50)]
    expected = [rnd.sample(docs, 5) for _ in range(4)]
    got = [[docs[i] for i in ids] for ids in fewshot_indices(4, 50, 5)]
    assert got == expected
    assert len({tuple(g) for g in got}) == 4  # each question gets its own shots


def test_chat_template_variant(data):
    class Tok:
        def apply_chat_template(self, messages, tokenize, add_generation_prompt):
            assert tokenize is False and add_generation_prompt is True
            return "".join(f"<{m['role']}>{m['content']}</{m['role']}>" for m in messages) + "<assistant>"

    seen = []
    evaluate_gsm8k(lambda ps: seen.extend(ps) or ["#### 1"] * len(ps), data, limit=1, num_fewshot=1,
                   chat_tokenizer=Tok(), progress=False)
    assert seen[0].startswith("<user>Question: ") and seen[0].count("<assistant>") == 2
    assert seen[0].endswith(f"<user>Question: {data.test[0]['question']}\nAnswer:</user><assistant>")


def test_input_errors(data):
    with pytest.raises(ValueError, match="num_fewshot=5 needs a few-shot"):
        evaluate_gsm8k(lambda p: p, list(data.test), progress=False)
    with pytest.raises(ValueError, match="num_fewshot=20 but the few-shot split has only 16"):
        evaluate_gsm8k(lambda p: p, data, num_fewshot=20, progress=False)
    with pytest.raises(ValueError, match="returned 0 completions for 2 prompts"):
        evaluate_gsm8k(lambda p: [], data, limit=2, progress=False)
    with pytest.raises(ValueError, match="limit must be >= 1"):
        evaluate_gsm8k(lambda p: p, data, limit=0, progress=False)


class _Bar:
    def __init__(self):
        self.steps = []

    def update(self, n=1):
        self.steps.append(n)


def test_bar_moves_per_question_inside_a_batch(data):
    """A generate_fn that takes ``on_finish`` moves the bar by one a question (the SmolLM2 gates' batch of 8
    moved it in one jump of 8 before); one that does not moves it by the batch."""

    def gen(prompts, on_finish):
        for i in reversed(range(len(prompts))):
            on_finish(i)
        return ["#### 0"] * len(prompts)

    bar = _Bar()
    evaluate_gsm8k(gen, data, limit=8, batch_size=16, progress=bar)
    assert bar.steps == [1] * 8
    bar = _Bar()
    evaluate_gsm8k(lambda prompts: ["#### 0"] * len(prompts), data, limit=8, batch_size=16, progress=bar)
    assert bar.steps == [8]

    def once_too_often(prompts, on_finish):  # reports one question, then all of them again
        for i in [0, *range(len(prompts))]:
            on_finish(i)
        return ["#### 0"] * len(prompts)

    bar = _Bar()
    evaluate_gsm8k(once_too_often, data, limit=8, batch_size=5, progress=bar)
    assert bar.steps == [1] * 8  # never past a batch's size: 5 then 3
