"""The block hashes events carry, as TensorRT-LLM computes them, so a router that hashes a prompt itself finds the
blocks a kvcm manager announced.

* ``v1_block_key`` (V1's ``BlockKeyHasher``, ``kvCacheManager.cpp``; V2's ``kv_cache_hash.hash_v1_block_key``): a
  64-bit chain, each block's hash seeded by its token count and its parent's hash, every token mixed in with a
  32-bit finalizer, the LoRA task id last with a 64-bit one; a cache salt is mixed into the first block of a
  prompt (the V2 form: V1's C++ mixes ``std::hash<std::string>`` of the salt, which no other process can
  reproduce). ``hash_v1_block_key([1, 2, 3, 4]) == 924206229973855`` (``test_v2_kv_cache_event_manager_v1_hash_
  algo_matches_v1_block_key_hash``).
* ``v2_sha256`` (V2's ``BlockRadixTree`` keys, ``_block_radix_tree.py``): SHA-256 over the parent's key and the
  block's tokens as 4-byte little-endian words; the root's key is SHA-256 of the reuse scope (a presence mask byte,
  then each present field as a little-endian uint64). Events carry it as hex text; ``v2_sha256_64`` as the first 8
  bytes, big-endian, unsigned.

kvcm's cache salt may be an int (used as the salt id) or a string (TensorRT-LLM's ``get_cache_salt_id``: the first
8 bytes of its SHA-256, little-endian); any other hashable salt is read through its ``repr``.
"""

from __future__ import annotations

import hashlib
from array import array

V1_BLOCK_KEY = "v1_block_key"
V2_SHA256 = "v2_sha256"
V2_SHA256_64 = "v2_sha256_64"
AUTO = "auto"
ALGORITHMS = (AUTO, V1_BLOCK_KEY, V2_SHA256, V2_SHA256_64)
"""``KvCacheConfig.kv_cache_event_hash_algo``'s values; ``auto`` is ``v1_block_key`` (upstream's default, so one
router reads V1 and V2 workers alike)."""

_U32, _U64 = (1 << 32) - 1, (1 << 64) - 1
_MIX32, _MIX64_A, _MIX64_B, _GOLDEN = 0x45D9F3B, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB, 0x9E3779B9


def _combine(seed: int, value: int) -> int:
    return (seed ^ ((value + ((seed << 6) & _U64) + (seed >> 2)) & _U64)) & _U64


def _mix32(seed: int, token: int) -> int:
    """One token into the seed: a 32-bit finalizer; the golden-ratio constant is added in 32 bits, as in C++."""
    a = token & _U32
    a = (((a >> 16) ^ a) * _MIX32) & _U32
    a = (((a >> 16) ^ a) * _MIX32) & _U32
    a = ((a >> 16) ^ a) & _U32
    return _combine(seed, (a + _GOLDEN) & _U32)


def _mix64(seed: int, value: int) -> int:
    """A 64-bit value (LoRA task id, salt id) into the seed: splitmix64's finalizer."""
    c = value & _U64
    c = ((c ^ (c >> 30)) * _MIX64_A) & _U64
    c = ((c ^ (c >> 27)) * _MIX64_B) & _U64
    c = (c ^ (c >> 31)) & _U64
    return _combine(seed, (c + _GOLDEN) & _U64)


def hash_v1_block_key(tokens, parent_hash: int = 0, lora_task_id: int | None = None,
                      cache_salt_id: int | None = None) -> int:
    seed = (len(tokens) ^ ((parent_hash * _MIX64_A) & _U64)) & _U64
    if parent_hash == 0 and cache_salt_id is not None:
        seed = _mix64(seed, cache_salt_id)
    for token in tokens:
        seed = _mix32(seed, token)
    if lora_task_id is not None:
        seed = _mix64(seed, lora_task_id)
    return seed


def cache_salt_id(salt) -> int | None:
    if salt is None:
        return None
    if isinstance(salt, int) and not isinstance(salt, bool):
        return salt & _U64
    text = salt if isinstance(salt, str) else repr(salt)
    return int.from_bytes(hashlib.sha256(text.encode("utf-8")).digest()[:8], "little")


def v2_root_key(lora_task_id: int | None, salt_id: int | None) -> bytes:
    fields = (lora_task_id, salt_id)
    mask = sum((value is not None) << i for i, value in enumerate(fields))
    raw = bytes([mask]) + b"".join(int(v).to_bytes(8, "little") for v in fields if v is not None)
    return hashlib.sha256(raw).digest()


def v2_block_key(parent_key: bytes, tokens) -> bytes:
    return hashlib.sha256(parent_key + array("I", tokens).tobytes()).digest()


def v2_event_hash(key: bytes, algo: str):
    return int.from_bytes(key[:8], "big") if algo == V2_SHA256_64 else key.hex()


def chain(algo: str, scope: tuple, token_blocks) -> list:
    """The event hashes of consecutive blocks from a root of ``scope`` = (LoRA task id, cache salt): what a router
    computes for a prompt's blocks."""
    lora, salt = scope
    out = []
    if algo == V1_BLOCK_KEY:
        h = 0
        for tokens in token_blocks:
            h = hash_v1_block_key(tokens, h, lora, cache_salt_id(salt))
            out.append(h)
        return out
    key = v2_root_key(lora, cache_salt_id(salt))
    for tokens in token_blocks:
        key = v2_block_key(key, tokens)
        out.append(v2_event_hash(key, algo))
    return out
