"""``block_tables``: the engine's one call a step for every running request's block table.

It hands out the manager's own lists rather than copies, so it must say exactly what ``block_table`` says, fail
the way ``block_table`` fails (naming the id), and, where a subclass overrides ``block_table`` (the parity gate's
off-by-one manager in ``suites/engine/test_parity.py``, handed to the engine's constructor), read through the
override: otherwise a defective table put in for a test would never reach the engine.
"""
import pytest

import kvcm
from kvcm.errors import UnknownRequestError
from kvcm.model_spec import ModelSpec


def _manager(kvcm_version):
    mgr = kvcm.create_kv_cache_manager(kvcm_version, ModelSpec.uniform(2, 1, 16),
                                       kvcm.KvCacheConfig(tokens_per_block=8, max_tokens=4096),
                                       max_batch_size=8, max_seq_len=512, device="meta")
    for rid, n in (("a", 5), ("b", 17), ("c", 40)):
        mgr.begin_context_chunk(rid, 0, n, n)
        mgr.end_context_chunk(rid, n)
    mgr.begin_generation("b")
    return mgr


def test_block_tables_equal_block_table_per_request(kvcm_version):
    mgr = _manager(kvcm_version)
    ids = ["c", "a", "b"]
    assert mgr.block_tables(ids) == [mgr.block_table(rid) for rid in ids]
    assert mgr.block_tables([]) == []


@pytest.mark.parametrize("bad", ["missing", ["unhashable"]])
def test_block_tables_name_an_id_the_manager_does_not_hold(kvcm_version, bad):
    mgr = _manager(kvcm_version)
    with pytest.raises((UnknownRequestError, kvcm.ConfigError)) as err:
        mgr.block_tables(["a", bad])
    assert str(bad) in str(err.value)


def test_an_overridden_block_table_is_what_block_tables_returns(kvcm_version):
    class Sevens(type(_manager(kvcm_version))):
        def block_table(self, request_id):
            return [[7] * len(t) for t in super().block_table(request_id)]
    mgr = _manager(kvcm_version)
    mgr.__class__ = Sevens
    assert mgr.block_tables(["a", "c"]) == [[[7] * len(t) for t in mgr._seqs[rid].blocks] for rid in ("a", "c")]

    class Shifted(type(mgr)):
        def block_table(self, request_id):
            return [t[1:] for t in super().block_table(request_id)]
    sub = _manager(kvcm_version)
    sub.__class__ = Shifted
    assert sub.block_tables(["c"]) == [sub.block_table("c")] != [[list(t) for t in sub._seqs["c"].blocks]]
