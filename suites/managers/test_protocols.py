"""kvcm's managers and drafters satisfy the declared step and drafter protocols (``kvcm/protocols.py``), member
by member and parameter by parameter, so the engine's contract is checked, not assumed."""

from __future__ import annotations

import inspect

import pytest

import kvcm
from kvcm.engine.ngram import NgramDrafter
from kvcm.protocols import Drafter, StepManager, missing_members

from _manager_specs import build, swa_spec, tiny_spec
from kvcm.versions import NAMES as ALL_VERSIONS


def _parameters(fn) -> list[str]:
    return [p for p in inspect.signature(fn).parameters if p != "self"]


def _check_signatures(obj, protocol) -> list[str]:
    """Each protocol method's parameters are accepted by ``obj``'s method under the same names, in order."""
    wrong = []
    for name, member in protocol.__dict__.items():
        if name.startswith("_") or not callable(member) or not hasattr(obj, name):
            continue   # a missing member is missing_members' to report
        want, have = _parameters(member), _parameters(getattr(obj, name))
        if have[:len(want)] != want:
            wrong.append(f"{name}{tuple(have)} != {tuple(want)}")
    return wrong


@pytest.mark.parametrize("kvcm_version", ALL_VERSIONS)
@pytest.mark.parametrize("spec", [tiny_spec(), swa_spec()], ids=["full", "swa"])
def test_managers_are_step_managers(kvcm_version, spec):
    mgr = build(kvcm_version, spec, kvcm.KvCacheConfig(max_tokens=4096))
    assert missing_members(mgr, StepManager) == []
    assert isinstance(mgr, StepManager)
    assert _check_signatures(mgr, StepManager) == []


def test_deepseek_v4_is_a_step_manager():
    mgr = kvcm.create_kv_cache_manager("v2", kvcm.DeepseekV4Spec(compress_ratios=(4, 128)),
                                       kvcm.KvCacheConfig(tokens_per_block=128, max_tokens=8192), max_batch_size=2, max_seq_len=2048,
                                       device="meta")
    assert isinstance(mgr, StepManager) and _check_signatures(mgr, StepManager) == []


def test_ngram_drafter_is_a_drafter():
    drafter = NgramDrafter(4)
    assert missing_members(drafter, Drafter) == []
    assert isinstance(drafter, Drafter) and _check_signatures(drafter, Drafter) == []


def test_model_drafter_is_a_drafter():
    from kvcm.engine.drafters import ModelDrafter

    assert missing_members(ModelDrafter, Drafter) == ["cost_per_draft", "name", "num_draft"]   # instance attributes
    assert _check_signatures(ModelDrafter, Drafter) == []


def test_an_incomplete_manager_is_named():
    """The check can fail: an object without the decode half of the contract is reported member by member."""

    class HalfManager:
        tokens_per_block = 32
        layer_groups: list = []

        def begin_context_chunk(self, request_id, start, num_tokens, prompt_len, draft_len=0): ...

        def end_context_chunk(self, request_id, history): ...

    missing = missing_members(HalfManager(), StepManager)
    assert "begin_generation" in missing and "free_resources" in missing
    assert not isinstance(HalfManager(), StepManager)


def test_a_renamed_parameter_is_named():
    class Renamed:
        def begin_generation(self, request_id, draft_len=0): ...

    wrong = [w for w in _check_signatures(Renamed(), StepManager) if w.startswith("begin_generation")]
    assert wrong, "a manager that renamed num_draft must be reported"
