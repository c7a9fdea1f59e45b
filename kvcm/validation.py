"""The Python API's input checks: every bad value becomes a ``ConfigError`` naming field, value and limit.

Two kinds of boundary, two tools:

* Config objects (``KvCacheConfig``, ``LayerSpec``, ``ModelSpec``, ``DeepseekV4Spec``) are pydantic dataclasses
  made by ``config_dataclass``: each field declares its type and limits once, in its annotation, and pydantic's
  errors are turned into ``ConfigError``. Unknown fields, bools for counts, strings for numbers, NaN and
  infinity are rejected.
* Manager operations run every engine step, so they use the small functions below: the common case (a plain
  ``int`` in range) is one type test and one comparison; only a value that fails pays for the explanation.
  Every operation checks its whole call before it changes anything, which is half of being all-or-nothing.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import operator
from collections.abc import Hashable, Iterable
from typing import Annotated

import pydantic
from pydantic import BeforeValidator, Field

from .errors import ConfigError

MAX_SEQ_LEN = 1 << 24
"""The longest ``max_seq_len`` a manager accepts (16,777,216 tokens; the longest published context windows are
10M): warmup's long dummy holds one block-table entry per block of it, so a length of 10^15 took minutes. Here,
not in ``limits``, so ``kvcm plan`` checks ``-S`` before torch loads."""

MAX_BATCH_SIZE = 1 << 16
"""The largest ``max_batch_size`` a manager accepts: constraints and warmup hold one entry per request, so a
batch size far beyond any engine's (TensorRT-LLM defaults to 2048) would take minutes before failing."""

MAX_LAYERS = 1 << 10
"""The most layers a model may have: specs, groups and pools hold one entry per layer, so a config of millions
of layers took minutes before answering; the deepest published LLMs have under 200."""
MAX_LAYERS_WHY = "kvcm.MAX_LAYERS: specs hold one entry a layer; published models have under 200"


# GPUs in one planned deployment (--tp x --pp). TensorRT-LLM itself bounds only pp_size (<= the model's layers,
# tensorrt_llm/mapping.py pp_layers) and requires tp x pp x cp == the MPI world size, held as SizeType32
# (cpp/tensorrt_llm/runtime/worldConfig.cpp); kvcm adds this bound so a typo (--tp 1000000 with attention DP)
# is refused instead of planned as a million GPUs.
MAX_WORLD_SIZE = 1 << 16
MAX_WORLD_SIZE_WHY = ("kvcm.MAX_WORLD_SIZE GPUs in one deployment; TensorRT-LLM bounds only pp_size by the layers and "
                      "tp x pp by its int32 world size")


def _as_int(field: str, value) -> int:
    """An integer-like value (``int``, numpy/torch integer scalars) as ``int``; bools, floats and strings are not."""
    if isinstance(value, bool):
        raise ConfigError(field, value, "must be an integer, not a bool")
    try:
        return operator.index(value)
    except TypeError:
        raise ConfigError(field, value, f"must be an integer, not {type(value).__name__}") from None


def count(field: str, value, low: int = 0, high: int | None = None, why: str = "") -> int:
    """``value`` as an int in ``[low, high]``; ``why`` names where ``high`` comes from (e.g. ``max_seq_len``)."""
    if type(value) is not int:
        value = _as_int(field, value)
    if value < low or (high is not None and value > high):
        if high is None:
            raise ConfigError(field, value, f"must be >= {low}")
        raise ConfigError(field, value, f"must be >= {low} and <= {high}" + (f" ({why})" if why else ""))
    return value


def plain(*values) -> bool:
    """True when every value is a plain ``int`` >= 0: one call for a hot path's common case; anything else takes
    the explaining ``count``."""
    for v in values:
        if type(v) is not int or v < 0:
            return False
    return True


def power_of_two(field: str, value) -> int:
    if type(value) is not int:
        value = _as_int(field, value)
    if value < 1 or value & (value - 1):
        raise ConfigError(field, value, "must be a positive integer and a power of two")
    return value


def optional_count(field: str, value, low: int = 0, high: int | None = None, why: str = "") -> int | None:
    return None if value is None else count(field, value, low, high, why)


def finite(field: str, value, low: float | None = None, high: float | None = None, *, open_low: bool = False,
           open_high: bool = False) -> float:
    """A finite real number in the given (optionally open) bounds."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) and not hasattr(value, "__float__"):
        raise ConfigError(field, value, f"must be a number, not {type(value).__name__}")
    number = float(value)
    if not math.isfinite(number):
        raise ConfigError(field, value, "must be a finite number")
    below = low is not None and (number <= low if open_low else number < low)
    above = high is not None and (number >= high if open_high else number > high)
    if below or above:
        lo = "-inf" if low is None else low
        hi = "inf" if high is None else high
        raise ConfigError(field, value, f"must be in {'(' if open_low else '['}{lo}, {hi}{')' if open_high else ']'}")
    return number


def flag(field: str, value) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(field, value, f"must be True or False, not {type(value).__name__}")
    return value


def request_id(value):
    """A request id is any hashable value (ints and strings in practice)."""
    if not isinstance(value, Hashable):
        raise ConfigError("request_id", value, f"must be hashable, not {type(value).__name__}")
    try:
        hash(value)
    except TypeError:
        raise ConfigError("request_id", value, "must be hashable") from None
    return value


def request_id_list(field: str, values) -> list:
    """A list of distinct request ids. A string is one id, not a list of one-character ids."""
    if isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
        raise ConfigError(field, values, "must be a list of request ids (a string is not a list)")
    out = [request_id(v) for v in values]
    if len(set(out)) != len(out):
        seen: set = set()
        dup = next(v for v in out if v in seen or seen.add(v))
        raise ConfigError(field, dup, "must be distinct; this id appears twice")
    return out


def dummy_call(request_ids, token_nums, is_gen, max_num_draft_tokens, kv_reserve_draft_tokens,
               max_seq_len: int) -> tuple[list, list[int], bool, int, int]:
    """``add_dummy_requests``' whole call, checked before anything is placed: the ids as a list, one token count
    each (default ``1 + drafts``) in ``[1, max_seq_len]``, and the draft reservation (default: the drafts)."""
    request_ids = request_id_list("request_ids", request_ids)
    is_gen = flag("is_gen", is_gen)
    drafts = count("max_num_draft_tokens", max_num_draft_tokens)
    reserve = drafts if kv_reserve_draft_tokens is None else count("kv_reserve_draft_tokens", kv_reserve_draft_tokens)
    if token_nums is None:
        return request_ids, [1 + drafts] * len(request_ids), is_gen, drafts, reserve
    if isinstance(token_nums, (str, bytes)) or not hasattr(token_nums, "__len__"):
        raise ConfigError("token_nums", token_nums, "must be a list with one token count per request id")
    if len(token_nums) != len(request_ids):
        raise ConfigError("token_nums", len(token_nums), f"must have one entry per request id ({len(request_ids)})")
    token_nums = [count("token_nums", t, 1, max_seq_len, "max_seq_len") for t in token_nums]
    return request_ids, token_nums, is_gen, drafts, reserve


# ---- config dataclasses (pydantic) -----------------------------------------------------------------------------
def _integer(value):
    return _as_int("value", value)


def _number(value):
    if isinstance(value, (bool, str, bytes)):
        raise ConfigError("value", value, f"must be a number, not {type(value).__name__}")
    return value


Int = Annotated[int, BeforeValidator(_integer)]
"""An integer field: ints and integer scalars (numpy, torch) pass; bools, floats and strings do not."""
Number = Annotated[float, BeforeValidator(_number), Field(allow_inf_nan=False)]
"""A finite real field; bools and strings are not numbers."""

_CONFIG = pydantic.ConfigDict(extra="forbid", arbitrary_types_allowed=True)


def _limit_text(err: dict, field_info) -> str:
    """The limit a pydantic error stands for, in this project's words."""
    kind, ctx = err["type"], err.get("ctx") or {}
    if field_info is not None and field_info.description and kind not in ("missing_argument",
                                                                        "unexpected_keyword_argument"):
        return field_info.description
    words = {"greater_than_equal": ">=", "greater_than": ">", "less_than_equal": "<=", "less_than": "<"}
    if kind in words:
        return f"must be {words[kind]} {next(iter(ctx.values()))}"
    if kind == "finite_number":
        return "must be a finite number"
    if kind == "missing_argument":
        return "is required"
    return err["msg"][0].lower() + err["msg"][1:]


def _translate(cls, exc: pydantic.ValidationError, given: dict) -> ConfigError:
    err = exc.errors(include_url=False)[0]
    cause = (err.get("ctx") or {}).get("error")
    loc = err["loc"]
    fields = [f.name for f in dataclasses.fields(cls)]
    name = cls.__name__ if not loc else fields[loc[0]] if isinstance(loc[0], int) else str(loc[0])
    if err["type"] == "unexpected_keyword_argument":
        return ConfigError(f"{cls.__name__}.{name}", err["input"], f"is not a field; the fields are {', '.join(fields)}")
    if err["type"] == "unexpected_positional_argument":
        return ConfigError(cls.__name__, err["input"], f"takes at most {len(fields)} positional arguments")
    value = given.get(name, err.get("input"))
    if isinstance(cause, ConfigError):
        if cause.field != "value":  # a check that names its own field (a cross-field limit, resolve_dtype)
            return cause
        return ConfigError(name, value, cause.limit)
    info = cls.__pydantic_fields__.get(name)
    return ConfigError(name, value, _limit_text(err, info))


def config_dataclass(cls):
    """A frozen pydantic dataclass whose bad inputs raise ``ConfigError`` (the first error, field by name)."""
    cls = pydantic.dataclasses.dataclass(frozen=True, config=_CONFIG)(cls)
    init = cls.__init__
    names = [f.name for f in dataclasses.fields(cls)]

    @functools.wraps(init)
    def __init__(self, *args, **kwargs):
        try:
            init(self, *args, **kwargs)
        except pydantic.ValidationError as exc:
            raise _translate(cls, exc, dict(zip(names, args)) | kwargs) from None

    cls.__init__ = __init__
    return cls
