"""``sampler``: the greedy choice and its margin, and ``unpack``, which turns a step's packed tensor into the
lists the scheduler reads. ``unpack`` converts small steps in Python and large ones with torch (whichever costs
less host time); both must give the same ids, as ints, and the same margins."""
import pytest
import torch

from kvcm.engine import sampler


@pytest.mark.parametrize("rows", [1, 63, 64, 256])
def test_unpack_gives_int_ids_and_float_margins_at_every_size(rows):
    g = torch.Generator().manual_seed(rows)
    logits = torch.randn(rows + 3, 49152, generator=g)
    packed = sampler.greedy_packed(logits)
    tokens, margins = sampler.unpack(packed, rows)
    top = logits[:rows].topk(2, dim=-1)
    assert tokens == top.indices[:, 0].tolist() and all(type(t) is int for t in tokens)
    assert margins == pytest.approx((top.values[:, 0] - top.values[:, 1]).tolist())
    assert all(type(m) is float for m in margins)


def test_unpack_keeps_ids_beyond_float32_precision():
    """Ids travel as float64: exact up to 2 ** 53, far past any vocabulary."""
    ids = [0, 49151, 2 ** 24 + 1, 2 ** 40 + 3]
    packed = torch.tensor([ids * 20, [0.5] * 80], dtype=torch.float64)
    assert sampler.unpack(packed, 80)[0] == ids * 20
    assert sampler.unpack(packed, 4)[0] == ids
