"""Any manager with TensorRT-LLM's Python surface (``KVCacheManager`` in ``tensorrt_llm._torch.pyexecutor``).

The plugin's page-boundary check already accepts this surface; this adapter puts it behind the contract:
requests are generation dummies (``add_dummy_requests(..., is_gen=True)`` holds ``token_num + E + K`` slots),
growth is V2's ``resize`` (or V1's ``add_tokens``), release is ``free_resources``. TensorRT-LLM itself does not
install on this machine, so the built-in ``trtllm`` target wraps kvcm V2; pass your own manager with
``TrtllmShapedTarget(spec, manager=...)`` from a conftest.
"""

from __future__ import annotations

from .contract import KVCacheTarget, PoolSpec
from .kvcm_targets import KvcmV2Target


class TrtllmShapedTarget(KVCacheTarget):
    name = "trtllm"

    def __init__(self, spec: PoolSpec, manager=None):
        super().__init__(spec)
        self.manager = manager if manager is not None else KvcmV2Target(spec).manager
        self.page_size = self.manager.tokens_per_block
        self.total_pages = self.manager.get_num_free_blocks()
        self._e = getattr(self.manager, "num_extra_kv_tokens", 0)

    def free_pages(self) -> int:
        return self.manager.get_num_free_blocks()

    def held_pages(self, rid):
        held = self.manager.num_blocks_held(rid)
        return {"full": held[0]} | ({"window": held[-1]} if len(held) > 1 else {})

    def _allocate(self, rid, num_tokens, lookahead):
        return self.allocate_batch([rid], [num_tokens], lookahead, _record=False)

    def allocate_batch(self, rids, token_nums, lookahead=0, _record=True) -> bool:
        """One ``add_dummy_requests`` call, as TensorRT-LLM's warmup makes its batches: all or none."""
        made = self.manager.add_dummy_requests(list(rids), token_nums=list(token_nums), is_gen=True,
                                               max_num_draft_tokens=lookahead)
        if made is None:
            return False
        if _record:
            self._tokens.update(zip(rids, token_nums))
        return True

    def _grow(self, rid, have, num_tokens, lookahead):
        capacity = max(self.manager.get_capacity(rid), have + num_tokens + lookahead + self._e)
        if hasattr(self.manager, "resize"):
            return self.manager.resize(rid, capacity, have)
        try:
            self.manager.add_tokens(rid, capacity - self.manager.get_capacity(rid))
        except Exception:  # V1's OutOfPagesError or the engine's own
            return False
        return True

    def _free(self, rid):
        self.manager.free_resources(rid)

    def available_tokens(self, bound: int, batch_size: int = 1, lookahead: int = 0) -> int:
        return self.manager.get_num_available_tokens(token_num_upper_bound=bound, batch_size=batch_size,
                                                     max_num_draft_tokens=lookahead)

    def allocate_generation(self, rids, token_nums, lookahead=0) -> bool:
        return self.allocate_batch(rids, token_nums, lookahead)
