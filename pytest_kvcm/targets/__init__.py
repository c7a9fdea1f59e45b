"""Managers under test: one engine-neutral contract, adapters for kvcm and for managers we did not write.

``--kvcm-target=kvcm-v1,kvcm-v2,vllm,...`` parametrizes every test that asks for the ``kvcm_target`` fixture
(the contract suites in ``pytest_kvcm/contract/``) once per target, as ``--kvcm-version`` does for V1/V2. A test
receives a *factory*: ``kvcm_target(PoolSpec(...))`` builds a fresh manager of that engine, sized as asked.

The contract (``KVCacheTarget``) is what every paged KV cache manager offers a scheduler, in the scheduler's
words: a request of ``n`` tokens is allocated with ``lookahead`` extra slots (speculative draft tokens,
vLLM's lookahead, TensorRT-LLM's max_num_draft_tokens), grown by ``n`` more tokens once the previous ones are
computed, and freed; the pool reports its free pages, its page size and the pages it holds back from every
request (vLLM's null block). An allocation either succeeds or returns False with nothing changed.

The built-in targets (kvcm's managers, vLLM, SGLang, transformers, TensorRT-LLM's surface) are declared in
``declared.py``: name, adapter, pinned release, venv script. A target whose package is missing skips with the
install hint. Add your own from a ``conftest.py``::

    def pytest_kvcm_register_targets(registry):
        registry["mine"] = MyAdapter          # a callable PoolSpec -> KVCacheTarget

then run ``pytest --kvcm-target=mine --pyargs pytest_kvcm.contract`` from any directory.
"""

from .contract import KVCacheTarget, PoolSpec, TargetUnavailable
from .registry import BUILTIN_TARGETS, build_target_registry

__all__ = ["BUILTIN_TARGETS", "KVCacheTarget", "PoolSpec", "TargetUnavailable", "build_target_registry"]
