"""GSM8K as lm-evaluation-harness's ``gsm8k`` task (version 3), on any generate function.

What is copied from lm-eval (facts, so scores are comparable with the ones people publish):
* prompt ``Question: {question}\\nAnswer:``; a few-shot example is that plus ``" " + answer``; examples and the
  question are joined by ``"\\n\\n"``; ``num_fewshot = 5`` from the train split;
* few-shot examples drawn like lm-eval's default sampler: ``random.Random(1234)``, one ``sample(train, k)`` per
  question in dataset order (``random.sample`` picks by index, so drawing indices gives the same examples);
* greedy decoding, ``until = ["Question:", "</s>", "<|im_end|>"]``, at most 256 new tokens;
* ``strict-match``: first ``#### (\\-?[0-9\\.\\,]+)``; ``flexible-extract``: the last match of
  ``(-?[$0-9.,]{2,})|(-?[0-9]+)``; both compared case-insensitively after removing ``,``, ``$``, everything up
  to ``#### `` and a trailing ``.``.
The gate score is the mean of the two filters (what TensorRT-LLM's GSM8K evaluator reports with
``scores_filter=None``); both are kept. Scores are 0-100.
"""

from __future__ import annotations

import inspect
import random
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

from .arith import DATA_DIR, TEST_FILE, TRAIN_FILE

NUM_FEWSHOT = 5
MAX_NEW_TOKENS = 256
FEWSHOT_SEED = 1234
STOP_STRINGS = ("Question:", "</s>", "<|im_end|>")
INVALID = "[invalid]"
STRICT_RE = re.compile(r"#### (\-?[0-9\.\,]+)")
FLEXIBLE_RE = re.compile(r"(-?[$0-9.,]{2,})|(-?[0-9]+)")
_IGNORE = (re.compile(","), re.compile(r"\$"), re.compile(r"(?s).*#### "), re.compile(r"\.$"))
EMBEDDED = "embedded"  # the name of the default data set in reports

GenerateFn = Callable[..., list[str]]


# ----------------------------------------------------------------------------------------------- scoring
def normalize(text: str) -> str:
    """lm-eval's ``regexes_to_ignore`` for gsm8k, in its order, then case folding."""
    for rx in _IGNORE:
        text = rx.sub("", text)
    return text.strip().lower()


def extract_answer(text: str, mode: str = "strict") -> str:
    """The normalised answer a completion gives, or ``[invalid]``.

    ``strict``: the number after the first ``#### ``; ``flexible``: the last number-like run in the text.
    """
    if mode == "strict":
        m = STRICT_RE.search(text)
        return normalize(m.group(1)) if m else INVALID
    if mode == "flexible":
        matches = FLEXIBLE_RE.findall(text)
        if not matches:
            return INVALID
        return normalize(next(g for g in matches[-1] if g))
    raise ValueError(f"extract_answer mode must be 'strict' or 'flexible': got {mode!r}")


def target_answer(answer: str) -> str:
    """The reference number of a GSM8K answer (the text after ``#### ``), normalised."""
    return normalize(answer)


def truncate_at_stop(text: str, stop: Iterable[str] = STOP_STRINGS) -> str:
    """Cut a completion at its first stop string (engines may overshoot by a few tokens)."""
    cut = len(text)
    for s in stop:
        i = text.find(s)
        if i != -1:
            cut = min(cut, i)
    return text[:cut]


# ----------------------------------------------------------------------------------------------- data
@dataclass
class GSM8KData:
    """A test split and the train split its few-shot examples come from (``datasets.Dataset`` each)."""

    test: Any
    train: Any | None
    source: str


def _load_files(kind: str, files: dict[str, str]):
    import datasets

    ds = datasets.load_dataset(kind, data_files=files)
    return {split: ds[split] for split in files}


def split_file(root: Path, split: str) -> tuple[str, str] | None:
    """The data-files kind and file(s) of ``split`` in a GSM8K directory, or None (also the start-up check's)."""
    for name in (f"{split}.jsonl", f"{split}.json"):
        if (root / name).is_file():
            return "json", str(root / name)
    if (root / f"{split}.parquet").is_file():
        return "parquet", str(root / f"{split}.parquet")
    shards = sorted(root.glob(f"**/{split}-*.parquet"))  # the hub's layout: main/test-00000-of-00001.parquet
    if shards:
        return "parquet", str(shards[0]) if len(shards) == 1 else [str(s) for s in shards]
    return None


def _check_columns(ds, where: str) -> None:
    missing = {"question", "answer"} - set(ds.column_names)
    if missing:
        raise ValueError(f"{where}: GSM8K rows need columns 'question' and 'answer'; missing {sorted(missing)}, "
                         f"has {ds.column_names}")


def load_gsm8k(source: str | Path | None = None, *, split: str = "test") -> GSM8KData:
    """Load GSM8K (or the embedded arithmetic set) through ``datasets``.

    ``source`` None: the embedded seeded arithmetic problems (``arith.py``). A directory: ``test.jsonl`` /
    ``train.jsonl`` (or ``.parquet``, or the hub's ``main/test-*.parquet``). A file: that file is the test
    split and a sibling with ``test`` replaced by ``train`` (if any) the few-shot split. Anything else that
    is not a path is tried as a hub id (``load_dataset(id, "main")``), only because it was asked for.
    """
    if source is None:
        splits = _load_files("json", {"test": str(DATA_DIR / TEST_FILE), "train": str(DATA_DIR / TRAIN_FILE)})
        return GSM8KData(splits["test"], splits["train"], EMBEDDED)
    path = Path(source)
    if path.is_dir():
        test = split_file(path, split)
        if test is None:
            raise FileNotFoundError(f"GSM8K directory {path} has no {split}.jsonl, {split}.parquet or "
                                    f"**/{split}-*.parquet")
        train = split_file(path, "train") if split != "train" else None
        ds = _load_files(test[0], {split: test[1]})[split]
        tr = _load_files(train[0], {"train": train[1]})["train"] if train else None
    elif path.is_file():
        kind = "parquet" if path.suffix == ".parquet" else "json"
        ds = _load_files(kind, {split: str(path)})[split]
        sibling = path.with_name(path.name.replace("test", "train"))
        tr = _load_files(kind, {"train": str(sibling)})["train"] if sibling != path and sibling.is_file() else None
    elif str(source).startswith((".", "/", "~")) or path.suffix in (".jsonl", ".json", ".parquet"):
        raise FileNotFoundError(f"GSM8K path {source} does not exist")
    else:
        import datasets

        hub = datasets.load_dataset(str(source), "main")
        ds, tr = hub[split], hub["train"] if "train" in hub and split != "train" else None
    _check_columns(ds, f"{source} ({split})")
    if tr is not None:
        _check_columns(tr, f"{source} (train)")
    return GSM8KData(ds, tr, str(source))


# ----------------------------------------------------------------------------------------------- prompts
def format_question(question: str) -> str:
    return f"Question: {question}\nAnswer:"


def fewshot_indices(num_docs: int, num_train: int, k: int, seed: int = FEWSHOT_SEED) -> list[list[int]]:
    """Per question, the train indices of its few-shot examples (lm-eval's default sampler)."""
    if k > num_train:
        raise ValueError(f"num_fewshot={k} but the few-shot split has only {num_train} examples")
    rnd = random.Random(seed)
    return [rnd.sample(range(num_train), k) for _ in range(num_docs)]


def build_prompt(question: str, shots: Sequence[dict]) -> str:
    parts = [f"{format_question(s['question'])} {s['answer']}" for s in shots]
    return "\n\n".join([*parts, format_question(question)])


def build_chat_prompt(question: str, shots: Sequence[dict], tokenizer) -> str:
    """Chat-template variant (lm-eval's ``--apply_chat_template --fewshot_as_multiturn``): one turn per shot."""
    messages = []
    for s in shots:
        messages += [{"role": "user", "content": format_question(s["question"])},
                     {"role": "assistant", "content": s["answer"]}]
    messages.append({"role": "user", "content": format_question(question)})
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


# ----------------------------------------------------------------------------------------------- evaluation
@dataclass
class Sample:
    question: str
    target: str
    completion: str
    strict: str
    flexible: str

    @property
    def strict_ok(self) -> bool:
        return self.strict == self.target

    @property
    def flexible_ok(self) -> bool:
        return self.flexible == self.target


@dataclass
class GSM8KResult:
    strict: float  # 0-100
    flexible: float  # 0-100
    num_samples: int
    num_fewshot: int
    source: str = ""
    samples: list[Sample] = field(default_factory=list, repr=False)

    @property
    def score(self) -> float:
        """The gate's score: both filters averaged."""
        return (self.strict + self.flexible) / 2


def _accepts(fn: Callable, name: str) -> bool:
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    return name in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())


def evaluate_gsm8k(
    generate_fn: GenerateFn,
    dataset,
    *,
    fewshot=None,
    num_fewshot: int = NUM_FEWSHOT,
    max_new_tokens: int = MAX_NEW_TOKENS,
    limit: int | None = None,
    batch_size: int = 16,
    chat_tokenizer=None,
    fewshot_seed: int = FEWSHOT_SEED,
    progress=None,
) -> GSM8KResult:
    """Score ``generate_fn(prompts: list[str]) -> list[str]`` on GSM8K.

    ``dataset``: a ``GSM8KData`` (its train split gives the shots), or the test rows (``datasets.Dataset`` or
    a list of dicts) with ``fewshot`` the train rows. ``generate_fn`` gets ``max_new_tokens=`` and ``stop=``
    when its signature takes them; completions are cut at the stop strings here anyway. ``chat_tokenizer``
    switches to the chat-template prompt. A tqdm bar shows on runs of more than one batch (``progress`` True or
    False forces it on or off); ``progress`` may also be a tqdm-like bar to advance by one a question (the
    ``kvcm_progress`` fixture makes bars that show while pytest captures output). A ``generate_fn`` that takes
    ``on_finish`` is passed a callable to call with each prompt's index as its completion is done, so the bar
    moves per question inside a batch; the bar is topped up to the batch's size when it returns.
    """
    source = ""
    if isinstance(dataset, GSM8KData):
        source, fewshot, dataset = dataset.source, dataset.train if fewshot is None else fewshot, dataset.test
    rows = list(dataset)
    if limit is not None:
        if limit < 1:
            raise ValueError(f"limit must be >= 1: got {limit}")
        rows = rows[:limit]
    if not rows:
        raise ValueError("GSM8K evaluation got no questions")
    shots_rows = list(fewshot) if (fewshot is not None and num_fewshot) else []
    if num_fewshot and not shots_rows:
        raise ValueError(f"num_fewshot={num_fewshot} needs a few-shot (train) split; none was given")
    idx = fewshot_indices(len(rows), len(shots_rows), num_fewshot, fewshot_seed) if num_fewshot else [[]] * len(rows)
    prompts = []
    for row, ids in zip(rows, idx):
        shots = [shots_rows[i] for i in ids]
        prompts.append(build_chat_prompt(row["question"], shots, chat_tokenizer) if chat_tokenizer is not None
                       else build_prompt(row["question"], shots))

    kwargs = {}
    if _accepts(generate_fn, "max_new_tokens"):
        kwargs["max_new_tokens"] = max_new_tokens
    if _accepts(generate_fn, "stop"):
        kwargs["stop"] = STOP_STRINGS
    batches = [range(i, min(i + batch_size, len(prompts))) for i in range(0, len(prompts), batch_size)]
    show = len(batches) > 1 if progress is None else progress
    bar = None
    if show is not None and not isinstance(show, bool):
        bar, show = show, False  # the caller's bar: advanced here, closed by the caller
    if show:
        try:
            from tqdm.auto import tqdm

            bar = tqdm(total=len(prompts), desc="gsm8k", unit="q", leave=False)
        except ImportError:  # progress is a nicety, never a requirement
            bar = None
    per_question = bar is not None and _accepts(generate_fn, "on_finish")
    completions: list[str] = []
    for b in batches:
        moved = [0]  # questions of this batch the bar has counted

        def on_finish(_index: int, moved=moved, size=len(b)) -> None:
            if moved[0] < size:
                moved[0] += 1
                bar.update(1)

        outs = generate_fn([prompts[i] for i in b], **kwargs, **({"on_finish": on_finish} if per_question else {}))
        if len(outs) != len(b):
            raise ValueError(f"generate_fn returned {len(outs)} completions for {len(b)} prompts")
        completions += [truncate_at_stop(o) for o in outs]
        if bar is not None and moved[0] < len(b):  # the rest of the batch (a generate_fn that never called it)
            bar.update(len(b) - moved[0])
    if bar is not None and bar is not progress:
        bar.close()

    samples = [Sample(r["question"], target_answer(r["answer"]), c, extract_answer(c, "strict"),
                      extract_answer(c, "flexible")) for r, c in zip(rows, completions)]
    n = len(samples)
    return GSM8KResult(
        strict=100.0 * sum(s.strict_ok for s in samples) / n,
        flexible=100.0 * sum(s.flexible_ok for s in samples) / n,
        num_samples=n, num_fewshot=num_fewshot, source=source, samples=samples,
    )


# ----------------------------------------------------------------------------------------------- adapters
def kvcm_generate_fn(llm, tokenizer=None, *, add_special_tokens: bool = True) -> GenerateFn:
    """Adapter for ``kvcm.engine.LLM``: text prompts -> token ids -> greedy generation -> text.

    Imported lazily: the engine is optional for everything else in this module.
    """
    from kvcm.engine import SamplingParams  # noqa: PLC0415

    tok = tokenizer if tokenizer is not None else getattr(llm, "tokenizer", None)
    if tok is None:
        raise ValueError("kvcm_generate_fn needs a tokenizer (pass one, or build the LLM with one)")
    stop_ids = tuple(i for i in (tok.eos_token_id,) if i is not None)

    def generate(prompts: list[str], max_new_tokens: int = MAX_NEW_TOKENS, stop: Sequence[str] = STOP_STRINGS,
                 on_finish=None):
        ids = [tok(p, add_special_tokens=add_special_tokens)["input_ids"] for p in prompts]
        params = SamplingParams(max_new_tokens=max_new_tokens, stop_token_ids=stop_ids, stop_strings=tuple(stop))
        outs = llm.generate(ids, params, on_finish=on_finish)
        return [o.text if getattr(o, "text", None) is not None else tok.decode(o.token_ids, skip_special_tokens=True)
                for o in outs]

    return generate


def hf_generate_fn(model, tokenizer, *, add_special_tokens: bool = True) -> GenerateFn:
    """Baseline adapter for Hugging Face ``generate``: batched, left padding, greedy, stop strings.

    Left padding keeps every prompt's last token at the end of the row, which is what greedy decoding of a
    batch needs; the pad token falls back to EOS when the tokenizer has none.
    """
    import torch

    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token

    def generate(prompts: list[str], max_new_tokens: int = MAX_NEW_TOKENS, stop: Sequence[str] = STOP_STRINGS):
        side = tokenizer.padding_side
        tokenizer.padding_side = "left"
        try:
            enc = tokenizer(list(prompts), return_tensors="pt", padding=True, add_special_tokens=add_special_tokens)
        finally:
            tokenizer.padding_side = side
        device = next(model.parameters()).device
        enc = {k: v.to(device) for k, v in enc.items()}
        with torch.no_grad():
            out = model.generate(**enc, max_new_tokens=max_new_tokens, do_sample=False, num_beams=1,
                                 stop_strings=list(stop), tokenizer=tokenizer, pad_token_id=tokenizer.pad_token_id)
        new = out[:, enc["input_ids"].shape[1]:]
        return [tokenizer.decode(row, skip_special_tokens=True) for row in new]

    return generate
