"""The attention type owns its page arithmetic and its page size (``kvcm/attention_types.py``): ``TYPES`` is the
registry a layer's type, its life-cycle key and the engine come from, a layer group delegates to its type, and the
engine never tests a type's class. A new type is its class plus a line in ``TYPES``."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

import kvcm
from kvcm import attention_types
from kvcm.attention_types import TYPES, ChunkedLocal, FullAttention, SlidingWindow, of_layer
from kvcm.config import KvCacheConfig
from kvcm.layer_groups import LayerGroup
from kvcm.model_spec import LayerSpec, ModelSpec

ROOT = Path(__file__).resolve().parents[2]


def _type_names() -> set[str]:
    return {cls.__name__ for cls in TYPES.values()} | {"AttentionType"}


def test_the_engine_never_tests_an_attention_types_class():
    """``isinstance(group, SlidingWindow)`` in the engine is how a new type silently takes the wrong branch; the
    engine asks the type instead (``with_window``, ``mask_floor``, ``window``, ``chunk_tokens``) and imports no
    concrete type."""
    names, offenders = _type_names(), []
    for path in sorted((ROOT / "kvcm" / "engine").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) in ("isinstance", "issubclass"):
                classes = node.args[1] if len(node.args) > 1 else None
                found = {n.id for n in ast.walk(classes) if isinstance(n, ast.Name)} if classes else set()
                found |= {n.attr for n in ast.walk(classes) if isinstance(n, ast.Attribute)} if classes else set()
                if found & names:
                    offenders.append(f"{path.relative_to(ROOT)}:{node.lineno} isinstance on {sorted(found & names)}")
            if isinstance(node, ast.ImportFrom) and node.module and node.module.endswith("attention_types"):
                concrete = {a.name for a in node.names} & (names - {"AttentionType"})
                if concrete:
                    offenders.append(f"{path.relative_to(ROOT)}:{node.lineno} imports {sorted(concrete)}")
    assert not offenders, offenders


def test_the_scan_finds_an_isinstance_on_a_type(tmp_path):
    bad = "from ..attention_types import SlidingWindow\n\ndef f(g):\n    return isinstance(g, (int, SlidingWindow))\n"
    hits = [n for n in ast.walk(ast.parse(bad)) if isinstance(n, ast.Call) and getattr(n.func, "id", None) ==
            "isinstance" and {m.id for m in ast.walk(n.args[1]) if isinstance(m, ast.Name)} & _type_names()]
    assert len(hits) == 1


def test_a_group_delegates_its_arithmetic_and_page_size_to_its_type():
    """No copy of the type's arithmetic in ``LayerGroup``: its answers are the type's, at the type's page size,
    and the window and sinks it reports are the type's fields, not its own."""
    assert {f.name for f in dataclasses.fields(LayerGroup)} >= {"attention"}
    assert not {"window", "sink_tokens", "tokens_per_block"} & {f.name for f in dataclasses.fields(LayerGroup)}
    for attention in (SlidingWindow(40, 20, tokens_per_block=16), ChunkedLocal(24, tokens_per_block=16),
                      FullAttention(tokens_per_block=16)):
        group = LayerGroup(0, (0,), attention, 1)
        assert group.tokens_per_block == 16 and group.window == attention.window
        for history in (0, 15, 16, 39, 40, 41, 100, 1000):
            assert group.stale_range(history) == attention.stale_range(history)
            assert group.pages_needed(history + 3, history) == attention.pages_needed(history + 3, history)
        if attention.releases_pages:
            assert group.max_pages() == attention.max_pages()


def test_of_layer_and_the_life_cycle_ask_the_registry_in_its_order():
    assert type(of_layer(None, tokens_per_block=4)) is FullAttention
    assert type(of_layer(64, 4, tokens_per_block=4)) is SlidingWindow
    assert type(of_layer(None, 0, 8, tokens_per_block=4)) is ChunkedLocal
    assert attention_types.life_cycle(64, 5, None, 4) == (64, 2)
    assert attention_types.life_cycle(None, 0, 8, 4) == (None, 0, 8)


def test_the_engines_narrower_window_is_the_types_answer():
    full, sliding = FullAttention(tokens_per_block=4), SlidingWindow(64, tokens_per_block=4)
    assert full.with_window(16) == SlidingWindow(16, tokens_per_block=4)
    assert sliding.with_window(32) == SlidingWindow(32, tokens_per_block=4) and sliding.with_window(128) is None
    assert ChunkedLocal(8, tokens_per_block=4).with_window(8) is None


@dataclasses.dataclass(frozen=True)
class LastPageOnly(SlidingWindow):
    """A made-up type for the test: a layer whose window is under one page reads only the in-flight token's page."""

    kind = "last-page"

    @staticmethod
    def takes(window, chunk):
        return window is not None and window < 4

    def label(self) -> str:
        return f"lastpage{self.window_tokens}"


def test_a_new_attention_type_is_its_class_and_a_registry_line(monkeypatch):
    """Put the made-up type first in ``TYPES`` and nothing else: its layers get their own group of that type, the
    manager releases pages by its arithmetic, and the engine's question about a narrower window is its answer."""
    monkeypatch.setattr(attention_types, "TYPES", {"last-page": LastPageOnly, **TYPES})
    spec = ModelSpec((LayerSpec(1, 8, "bfloat16", 2, model_layer=0), LayerSpec(1, 8, "bfloat16", model_layer=1)),
                     name="last-page-and-full")
    mgr = kvcm.create_kv_cache_manager("v2", spec, KvCacheConfig(tokens_per_block=4, max_tokens=64,
                                                                 enable_block_reuse=False),
                                       max_batch_size=2, max_seq_len=64, device="meta")
    small, full = mgr.layer_groups
    assert type(small.attention) is LastPageOnly and small.name == "lastpage2" and full.is_full
    for start in range(0, 20, 4):             # a page a chunk: the window's pages go as history moves on
        mgr.begin_context_chunk("r", start, 4, 20)
        mgr.end_context_chunk("r", start + 4)
    table = mgr.block_table("r")
    assert sum(b >= 0 for b in table[0]) == small.pages_needed(20, 20) == 1
    assert sum(b >= 0 for b in table[1]) == 5


@pytest.mark.parametrize("version", kvcm.versions.NAMES)
def test_each_group_holds_its_types_page_size(version):
    spec = ModelSpec((LayerSpec(1, 8, "bfloat16", 16, model_layer=0), LayerSpec(1, 8, "bfloat16", model_layer=1),
                      LayerSpec(1, 8, "bfloat16", attention_chunk=8, model_layer=2)), name="three-types")
    mgr = kvcm.create_kv_cache_manager(version, spec, KvCacheConfig(tokens_per_block=8, max_tokens=256),
                                       max_batch_size=2, max_seq_len=128, device="meta")
    assert [g.attention.tokens_per_block for g in mgr.layer_groups] == [8, 8, 8]
    assert [type(g.attention) for g in mgr.layer_groups] == [SlidingWindow, FullAttention, ChunkedLocal]
