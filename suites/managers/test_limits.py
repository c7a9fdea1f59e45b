"""``kvcm.Limits``: one frozen bundle of what an engine promises a cache, accepted in place of its keywords."""

import dataclasses

import pytest
import torch

import kvcm
from kvcm import ConfigError, KvCacheConfig, Limits, ModelSpec
from kvcm.versions import NAMES as ALL_VERSIONS

SPEC = ModelSpec.uniform(2, 2, 8)
CFG = KvCacheConfig(max_tokens=256, tokens_per_block=16)


@pytest.mark.parametrize("kvcm_version", ALL_VERSIONS)
def test_limits_and_keywords_build_the_same_manager(kvcm_version):
    limits = Limits(max_batch_size=4, max_seq_len=128, max_num_tokens=64, max_draft_len=2, num_extra_kv_tokens=1)
    by_object = kvcm.create_kv_cache_manager(kvcm_version, SPEC, CFG, limits)
    by_keywords = kvcm.create_kv_cache_manager(kvcm_version, SPEC, CFG, **limits.as_kwargs())
    assert by_object.limits == by_keywords.limits == limits
    assert by_object.describe() == by_keywords.describe()
    assert (by_object.max_batch_size, by_object.max_seq_len, by_object.max_draft_len) == (4, 128, 2)
    assert by_object.device == torch.device("meta")


def test_limits_are_frozen_and_replace_makes_a_new_one():
    limits = Limits(max_batch_size=4, max_seq_len=128)
    with pytest.raises(dataclasses.FrozenInstanceError):
        limits.max_seq_len = 256
    longer = limits.replace(max_seq_len=256)
    assert (limits.max_seq_len, longer.max_seq_len, longer.max_batch_size) == (128, 256, 4)


@pytest.mark.parametrize("kwargs, field", [
    (dict(max_batch_size=0, max_seq_len=8), "max_batch_size"),
    (dict(max_batch_size=1, max_seq_len=8, max_draft_len=-1), "max_draft_len"),
    (dict(max_batch_size=1, max_seq_len=8, device="nowhere"), "device"),
])
def test_bad_limits_name_the_field(kwargs, field):
    with pytest.raises(ConfigError, match=field):
        Limits(**kwargs)


def test_limits_given_twice_or_missing_is_an_error():
    limits = Limits(max_batch_size=4, max_seq_len=128)
    with pytest.raises(ConfigError, match="max_seq_len.*given twice"):
        kvcm.create_kv_cache_manager("v2", SPEC, CFG, limits, max_seq_len=64)
    with pytest.raises(ConfigError, match="max_seq_len.*required"):
        kvcm.create_kv_cache_manager("v2", SPEC, CFG, max_batch_size=4)
