"""Managers with a request already held, and a snapshot of everything a failed call must leave as it was."""

from __future__ import annotations

import kvcm
from kvcm.config import KvCacheConfig
from kvcm.model_spec import ModelSpec

KINDS = ("v1", "v2", "v4")
MAX_SEQ_LEN = 256


def make_manager(kind: str):
    """A meta-device manager of ``kind`` (V1, V2 or DeepSeek-V4) with plenty of pages and request 'held' in it."""
    if kind == "v4":
        spec = kvcm.DeepseekV4Spec(compress_ratios=(4, 128), window_size=128, head_dim=512, index_head_dim=128)
        mgr = kvcm.create_kv_cache_manager("v2", spec, KvCacheConfig(tokens_per_block=128, max_gpu_total_bytes=2**28),
                                           max_batch_size=4, max_seq_len=MAX_SEQ_LEN, max_draft_len=2, device="meta")
    else:
        mgr = kvcm.create_kv_cache_manager(kind, ModelSpec.uniform(2, 1, 16), KvCacheConfig(max_tokens=64 * 32),
                                           max_batch_size=4, max_seq_len=MAX_SEQ_LEN, max_draft_len=2, device="meta")
    mgr.begin_context_chunk("held", 0, 40, 40)
    mgr.end_context_chunk("held", 40)
    return mgr


def snapshot(mgr) -> tuple:
    """Held requests with capacity, history and block tables, and which blocks of every pool are in use."""
    requests = {r: (mgr.get_capacity(r), mgr.get_history(r), mgr.block_table(r)) for r in mgr.request_ids}
    return requests, [(p.num_free, bytes(p._used)) for p in mgr.pools]


def unprivileged_prefix() -> list[str]:
    """A command prefix that runs a process as an ordinary user, so a read-only file is read-only to it: root
    writes through file modes, and the results checks must be tried as the users who meet them. Skips when
    running as root without ``setpriv``."""
    import os
    import shutil

    import pytest

    if os.geteuid() != 0:
        return []
    if shutil.which("setpriv") is None:
        pytest.skip("running as root without setpriv: a read-only file is writable here")
    return ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]


def shared_tmp(prefix: str):
    """A directory under /tmp that the unprivileged user can enter and write (pytest's tmp_path is root's only)."""
    import os
    import tempfile

    path = tempfile.mkdtemp(prefix=prefix)
    os.chmod(path, 0o777)
    return path
