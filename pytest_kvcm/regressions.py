"""Regression injection: historic KV-cache defects put back into ``kvcm`` for one run.

``pytest --kvcm-inject=NAME`` applies one registered defect (by monkeypatching ``kvcm`` from here: ``kvcm``
itself has no bug switches) so a suite can be shown to catch it; ``kvcm sensitivity`` runs the CPU lane once
per defect and reports which tests caught each. Users add their own defects through the
``pytest_kvcm_register_defects(registry)`` hook.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import pytest


@dataclass(frozen=True)
class Defect:
    name: str
    story: str
    patch: Callable[[pytest.MonkeyPatch], None]


class DefectRegistry:
    def __init__(self):
        self._defects: dict[str, Defect] = {}

    def register(self, name: str, story: str, patch: Callable[[pytest.MonkeyPatch], None]) -> None:
        if name in self._defects:
            raise ValueError(f"defect {name!r} is already registered")
        self._defects[name] = Defect(name, story, patch)

    def __getitem__(self, name: str) -> Defect:
        if name not in self._defects:
            import difflib

            near = difflib.get_close_matches(name, list(self._defects), n=3)
            hint = f"; did you mean {', '.join(near)}?" if near else ""
            raise pytest.UsageError(f"--kvcm-inject={name!r} is not a registered defect{hint} "
                                    f"(known: {', '.join(sorted(self._defects))})")
        return self._defects[name]

    def __iter__(self):
        return iter(self._defects.values())

    def names(self) -> list[str]:
        return list(self._defects)


# ---- the built-in defects -----------------------------------------------------------------------------------
def _gen_dummy_extra_token(mp: pytest.MonkeyPatch) -> None:
    """Generation dummies hold token_num + E + K + 1: the current input counted twice."""
    from kvcm.manager_v1 import KVCacheManagerV1
    from kvcm.manager_v2 import KVCacheManagerV2

    for cls in (KVCacheManagerV1, KVCacheManagerV2):
        original = cls._place_dummy

        def place(self, request_id, token_num, is_gen, reserve, _original=original):
            return _original(self, request_id, token_num, is_gen, reserve + 1 if is_gen else reserve)

        mp.setattr(cls, "_place_dummy", place)


def _generic_longest_decode(mp: pytest.MonkeyPatch) -> None:
    """The longest-decode constraint moved from DeepSeek-V4 into generic V2."""
    from kvcm.config import BatchDesc, KVCacheDesc
    from kvcm.constraints import NamedConstraint
    from kvcm.manager_v2 import KVCacheManagerV2

    original = KVCacheManagerV2._named_constraints

    def named(self, _original=original):
        out = _original(self)
        s, b = self.max_seq_len, self.max_batch_size
        short = KVCacheDesc(1 + self.max_draft_len + self.num_extra_kv_tokens, 0)
        return out + [NamedConstraint("longest_decode", BatchDesc([KVCacheDesc(s, s - 1)] + [short] * (b - 1)))]

    mp.setattr(KVCacheManagerV2, "_named_constraints", named)


def _v4_constraints_ignore_pool_ratio(mp: pytest.MonkeyPatch) -> None:
    """DeepSeek-V4 built its constraints even when the user set an explicit pool_ratio."""
    from kvcm import constraints as c
    from kvcm.deepseek_v4 import DeepseekV4CacheManager

    def size_pools(self):
        cfg, tpb = self.kv_cache_config, self.tokens_per_block
        blocks = super(DeepseekV4CacheManager, self)._size_pools()
        if cfg.pool_ratio is None:
            return blocks
        named = self._named_constraints()
        self.constraint_names, self.constraints = [n.name for n in named], [n.batch for n in named]
        weights = c.split_weights(self.layer_groups, tpb, pool_ratio=cfg.pool_ratio, typical_step=None)
        return c.split_quota(self.budget_bytes, self.layer_groups, weights, named, tpb)

    mp.setattr(DeepseekV4CacheManager, "_size_pools", size_pools, raising=False)


def _available_tokens_ignore_draft(mp: pytest.MonkeyPatch) -> None:
    """get_num_available_tokens forgot to take the draft tokens away."""
    from kvcm.manager_v1 import KVCacheManagerV1
    from kvcm.manager_v2 import KVCacheManagerV2

    for cls in (KVCacheManagerV1, KVCacheManagerV2):
        original = cls.get_num_available_tokens

        def available(self, *, token_num_upper_bound, batch_size=1, max_num_draft_tokens=0, _original=original):
            return _original(self, token_num_upper_bound=token_num_upper_bound, batch_size=batch_size,
                             max_num_draft_tokens=0)

        mp.setattr(cls, "get_num_available_tokens", available)


def _context_constraint_ignores_extra(mp: pytest.MonkeyPatch) -> None:
    """The chunked-prefill constraint sized N tokens, forgetting the E extra KV tokens a context chunk takes."""
    import kvcm.manager_v2 as v2

    original = v2.generic_constraints

    def generic(**kw):
        return original(**{**kw, "num_extra_kv_tokens": 0})

    mp.setattr(v2, "generic_constraints", generic)


def _stale_window_early_release(mp: pytest.MonkeyPatch) -> None:
    """Sliding-window blocks released one token early: the in-flight token's window start was forgotten."""
    from kvcm.layer_groups import LayerGroup, ceil_div

    def stale_range(self, history, tpb):
        if self.window is None:
            return (0, 0)
        lo = min(ceil_div(history, tpb), self.sink_blocks(tpb))
        return lo, max(lo, (history + 2 - self.window) // tpb)

    mp.setattr(LayerGroup, "stale_range", stale_range)


BUILTIN = [
    ("gen-dummy-extra-token", "generation dummies one token too large: CUDA-graph warmup skipped page-boundary "
                              "batch shapes", _gen_dummy_extra_token),
    ("generic-longest-decode", "V4's longest-decode constraint in generic V2 inflated every ordinary model's "
                               "estimation pool past its budget", _generic_longest_decode),
    ("v4-constraints-ignore-pool-ratio", "DeepSeek-V4 built constraints despite an explicit pool_ratio",
     _v4_constraints_ignore_pool_ratio),
    ("available-tokens-ignore-draft", "available tokens not reduced by the draft tokens: spec-decode dummies "
                                      "overflowed the pool", _available_tokens_ignore_draft),
    ("context-constraint-ignores-extra", "the chunked-prefill constraint forgot the extra KV tokens",
     _context_constraint_ignores_extra),
    ("stale-window-early-release", "sliding-window pages released one token early: attention read a freed "
                                   "page", _stale_window_early_release),
]


def build_registry(pluginmanager=None) -> DefectRegistry:
    registry = DefectRegistry()
    for name, story, patch in BUILTIN:
        registry.register(name, story, patch)
    if pluginmanager is not None:
        pluginmanager.hook.pytest_kvcm_register_defects(registry=registry)
    return registry


def pytest_addhooks(pluginmanager):
    from . import hookspecs

    pluginmanager.add_hookspecs(hookspecs)


def pytest_addoption(parser):
    group = parser.getgroup("kvcm")
    group.addoption("--kvcm-inject", metavar="NAME", default=None,
                    help="put one registered historic defect back into kvcm for this run (see --kvcm-list-defects)")
    group.addoption("--kvcm-list-defects", action="store_true", help="list the registered defects and exit")


def pytest_configure(config):
    registry = build_registry(config.pluginmanager)
    config._kvcm_defects = registry
    name = config.getoption("kvcm_inject")
    if name:
        defect = registry[name]
        mp = pytest.MonkeyPatch()
        defect.patch(mp)
        config._kvcm_injected = (defect, mp)
        config.add_cleanup(mp.undo)


def pytest_cmdline_main(config):
    if config.getoption("kvcm_list_defects"):
        config._do_configure()
        for defect in config._kvcm_defects:
            print(f"{defect.name}: {defect.story}")
        config._ensure_unconfigure()
        return 0
    return None


def pytest_report_header(config):
    injected = getattr(config, "_kvcm_injected", None)
    if injected:
        return f"kvcm: INJECTED DEFECT {injected[0].name}: {injected[0].story}"
    return None


@pytest.fixture
def kvcm_injected_defect(request) -> str | None:
    """Name of the defect injected in this run, or None."""
    injected = getattr(request.config, "_kvcm_injected", None)
    return injected[0].name if injected else None
