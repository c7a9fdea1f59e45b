"""The manager version is ``kvcm_version`` everywhere; the spellings users wrote before still work for now,
each with a ``DeprecationWarning`` that names the new spelling and points at the caller's line."""

import json
import warnings

import pytest

import kvcm
import kvcm.cli
from kvcm import KvCacheConfig, Limits, ModelSpec
from kvcm.engine import LLM
from kvcm.models import tiny_model
from kvcm.versions import NAMES as ALL_VERSIONS

SPEC = ModelSpec.uniform(2, 2, 8)
CFG = KvCacheConfig(max_tokens=256, tokens_per_block=16)
LIMITS = Limits(max_batch_size=4, max_seq_len=128)


def _one_warning(record, new: str) -> str:
    (w,) = [w for w in record if issubclass(w.category, DeprecationWarning)]
    assert new in str(w.message), str(w.message)
    assert w.filename == __file__, "the warning must point at the caller's line, not at kvcm's"
    return str(w.message)


def test_factory_version_keyword():
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        old = kvcm.create_kv_cache_manager(version="v2", model=SPEC, kv_cache_config=CFG, limits=LIMITS)
    msg = _one_warning(record, "use kvcm_version=")
    assert msg == "create_kv_cache_manager: version= is deprecated; use kvcm_version= (the old spelling goes in 0.2.0)"
    new = kvcm.create_kv_cache_manager(kvcm_version="v2", model=SPEC, kv_cache_config=CFG, limits=LIMITS)
    assert old.kvcm_version == "v2" and old.describe() == new.describe()


def test_factory_both_spellings_is_an_error():
    with pytest.raises(TypeError, match="got both version= .* and kvcm_version="):
        kvcm.create_kv_cache_manager(SPEC, version="v1", kvcm_version="v2")


def test_estimation_version_keyword():
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        est = kvcm.build_with_estimation(version="v1", model=SPEC, kv_cache_config=CFG, limits=LIMITS,
                                         free_memory_bytes=1 << 30)
    _one_warning(record, "build_with_estimation: version= is deprecated; use kvcm_version= "
                         "(the old spelling goes in 0.2.0)")
    assert est.manager.kvcm_version == "v1"


@pytest.mark.parametrize("kvcm_version", ALL_VERSIONS)
def test_manager_version_attribute(kvcm_version):
    mgr = kvcm.create_kv_cache_manager(kvcm_version, SPEC, CFG, LIMITS)
    with pytest.warns(DeprecationWarning, match=r"\.version is deprecated; use \.kvcm_version") as record:
        assert mgr.version == kvcm_version
    assert record[0].filename == __file__
    assert mgr.describe()["kvcm_version"] == kvcm_version and "version" not in mgr.describe()


def test_llm_manager_version_keywords():
    """``LLM(manager_version=, draft_manager_version=)``: both caches get the versions asked for."""
    target, draft = tiny_model("llama", seed=1)[0], tiny_model("llama", seed=2, num_hidden_layers=1)[0]
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        llm = LLM(target, manager_version="v1", drafter=draft, max_draft_len=2, draft_manager_version="v2",
                  kv_cache_config=KvCacheConfig(max_tokens=1024, dtype="float32"), max_batch_size=2, max_seq_len=64)
    messages = sorted(str(w.message) for w in record if issubclass(w.category, DeprecationWarning))
    assert messages == ["LLM: draft_manager_version= is deprecated; use draft_kvcm_version= "
                        "(the old spelling goes in 0.2.0)",
                        "LLM: manager_version= is deprecated; use kvcm_version= (the old spelling goes in 0.2.0)"]
    assert all(w.filename == __file__ for w in record if issubclass(w.category, DeprecationWarning))
    assert (llm.kvcm_version, llm.manager.kvcm_version, llm.drafter.manager.kvcm_version) == ("v1", "v1", "v2")
    with pytest.warns(DeprecationWarning, match=r"LLM: \.manager_version is deprecated; use \.kvcm_version"):
        assert llm.manager_version == "v1"
    llm.close()


def test_plan_version_flag(capsys):
    assert kvcm.cli.main(["plan", "--model", "llama-3-8b", "--kvcm-version", "v1", "--json"]) == 0
    new = capsys.readouterr()
    assert kvcm.cli.main(["plan", "--model", "llama-3-8b", "--version", "v1", "--json"]) == 0
    old = capsys.readouterr()
    assert old.out == new.out and [m["kvcm_version"] for m in json.loads(old.out)["managers"]] == ["v1"]
    assert "kvcm plan: --version is deprecated; use --kvcm-version" in old.err
    assert "--version" not in new.err
