"""GPU smoke: CUDA graphs, captured at warmup and replayed, at SmolLM2-135M's shape; speculative decoding on them.

* Warmup on a page boundary: a pool sized so that the bs=1 shape's long dummy ends exactly on a page edge (where
  the historic one-token-too-large dummy skipped the shape); every planned shape of both caches is captured.
* Replay at page edges: prompts of a page less one, a page and a page and one (twice over), decoding across the
  edges on the decode graphs, prefill on the token buckets: Hugging Face's tokens, V1 and V2.
* Speculation on graphs, both drafters: a truncated draft model (its own cache and graphs, ``(bs, 1)`` and
  ``(bs, 2)`` shapes) and the n-gram pool, the target verifying on its ``(bs, 1 + D)`` shapes: the target's
  own greedy tokens (fp32), V1 and V2.
"""
import pytest

import kvcm
from kvcm.models import truncated_drafter
from kvcm.versions import NAMES as ALL_VERSIONS

from _smoke import MARKS, ON_GPU, SCALE, around_pages, assert_parity, engine, params, prompts, reference

pytestmark = MARKS
VOCAB = 49152
D = 4


def _assert_all_captured(reports, what: str) -> None:
    for report in reports:
        assert report.skipped == [] and report.captured == report.planned, f"{what}: {report}"


def _assert_graphs(graphs) -> None:
    """On CUDA every static step is a captured graph (on the CPU they run statically, uncaptured)."""
    steps = list(graphs.shapes.values()) + list(graphs.buckets.values())
    assert steps and (not ON_GPU or all(s.graph is not None for s in steps))


@pytest.mark.parametrize("version", ALL_VERSIONS)
def test_warmup_on_a_page_boundary_captures_every_shape(smollm2, version):
    """Eight pages under a longer ``max_seq_len``: the long dummies are sized by the available tokens, so the bs=1
    shape's ends on a page edge; nothing is skipped, on the estimation cache or the final one, and the graphs
    replay Hugging Face's tokens."""
    tpb = SCALE.tpb
    llm = engine(smollm2, version, max_tokens=8 * tpb, max_seq_len=12 * tpb, max_batch_size=4, cuda_graph=True,
                 cuda_graph_token_buckets=[])
    _assert_all_captured(llm.warmup_reports, "target")
    final = llm.warmup_reports[-1]
    assert final.long_token_nums[kvcm.WarmupShape(1, 0)] % tpb == 0, "the bs=1 long dummy must end on a page edge"
    _assert_graphs(llm.graphs)
    ps = prompts(3, [tpb - 3, tpb - 1, 3], VOCAB)
    assert_parity(reference(smollm2, ps), llm.generate(ps, params()), ps, f"graphs-{version}")
    assert llm.graphs.num_replays > 0


@pytest.mark.parametrize("version", ALL_VERSIONS)
def test_graph_replay_across_page_edges_gives_hf_tokens(smollm2, version):
    ps = prompts(4, around_pages(SCALE.tpb), VOCAB)
    llm = engine(smollm2, version, max_batch_size=4, max_num_tokens=4 * SCALE.tpb, cuda_graph=True,
                 cuda_graph_batch_sizes=[1, 2, 4], cuda_graph_token_buckets=[2 * SCALE.tpb, 4 * SCALE.tpb])
    _assert_all_captured(llm.warmup_reports, "target")
    _assert_graphs(llm.graphs)
    assert_parity(reference(smollm2, ps), llm.generate(ps, params()), ps, f"graphs-{version}")
    assert llm.graphs.num_replays > llm.graphs.num_bucket_replays > 0


@pytest.mark.parametrize("drafter", ["model", "ngram"])
@pytest.mark.parametrize("version", ALL_VERSIONS)
def test_speculation_on_graphs_gives_the_targets_tokens(smollm2, drafter, version):
    """D = 4 drafts a step, speculating at every step whatever it gains (the gate and the cut-off off). Prompts
    repeat themselves so that prompt lookup proposes and a draft is sometimes right."""
    ps = [p * 3 for p in prompts(5, [SCALE.tpb // 2 + 1, SCALE.tpb - 1, 3], VOCAB)]
    d = truncated_drafter(smollm2, SCALE.drafter_layers) if drafter == "model" else "ngram"
    llm = engine(smollm2, version, max_batch_size=4, max_draft_len=D, drafter=d, draft_kvcm_version=version,
                 cuda_graph=True, cuda_graph_batch_sizes=[1, 2, 4], cuda_graph_token_buckets=[4 * SCALE.tpb],
                 max_num_tokens=4 * SCALE.tpb, spec_acceptance_window=0, spec_max_concurrency=None)
    _assert_all_captured(llm.warmup_reports + llm.draft_warmup_reports, f"{drafter} drafter")
    _assert_graphs(llm.graphs)
    assert {s.draft_len for s in llm.warmup_reports[-1].planned} >= {D}
    assert_parity(reference(smollm2, ps), llm.generate(ps, params()), ps, f"spec-{drafter}-{version}")
    assert llm.graphs.num_replays > 0 and llm.spec_stats.proposed > 0 and llm.spec_stats.steps_off == 0
    if drafter == "model":
        _assert_graphs(llm.drafter.graphs)
        assert llm.drafter.graphs.num_replays > 0
    llm.close()
    assert not llm.manager.request_ids
