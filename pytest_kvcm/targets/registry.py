"""Target names -> factories (``PoolSpec -> KVCacheTarget``); imports of engines stay lazy."""

from __future__ import annotations


def _kvcm(cls_name):
    def make(spec):
        from . import kvcm_targets

        return getattr(kvcm_targets, cls_name)(spec)

    return make


def _vllm(spec):
    from .vllm_target import VllmTarget

    return VllmTarget(spec)


def _sglang(spec):
    from .sglang_target import SglangTarget

    return SglangTarget(spec)


def _hf(spec):
    from .hf_target import HfPagedTarget

    return HfPagedTarget(spec)


def _trtllm(spec):
    from .trtllm_shaped import TrtllmShapedTarget

    return TrtllmShapedTarget(spec)


BUILTIN_TARGETS = {
    "kvcm-v1": _kvcm("KvcmV1Target"),
    "kvcm-v2": _kvcm("KvcmV2Target"),
    "kvcm-v4": _kvcm("KvcmV4Target"),
    "vllm": _vllm,
    "sglang": _sglang,
    "hf": _hf,
    "trtllm": _trtllm,
}


def build_target_registry(pluginmanager=None) -> dict:
    registry = dict(BUILTIN_TARGETS)
    if pluginmanager is not None:
        pluginmanager.hook.pytest_kvcm_register_targets(registry=registry)
    return registry
