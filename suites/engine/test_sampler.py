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


def _topk_reference(logits):
    """What the sampler computed before: ``topk(2)`` of the logits in fp32."""
    top = logits.float().topk(2, dim=-1)
    return top.indices[:, 0], top.values[:, 0] - top.values[:, 1]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_two_maxima_give_topks_tokens_and_margins_bit_for_bit(dtype):
    """The greedy choice without a top-k: the same tokens as ``topk(2)``'s first index and the same margins, to the
    bit, on SmolLM2's vocabulary width; the logits are left as they were. bf16 logits (few distinct values) make
    near ties common; an exact tie for the top gives margin 0 and the first index, as ``argmax`` (Hugging Face's
    greedy choice) does."""
    g = torch.Generator().manual_seed(7)
    logits = (torch.randn(96, 49152, generator=g) * 4).to(dtype)
    logits[5, 100] = logits[5, 40000] = logits[5].max() + 1          # a tie for the top, far apart
    logits[6] = float("-inf")
    logits[6, 3] = 2.0                                              # one finite logit: the margin is inf
    before = logits.clone()
    packed = sampler.greedy_packed(logits)
    assert torch.equal(logits, before)
    tokens, margins = packed[0].long(), packed[1].float()
    ref_tokens, ref_margins = _topk_reference(before)
    assert torch.equal(margins, ref_margins)
    assert torch.equal(tokens, before.float().argmax(-1))
    untied = ref_margins > 0
    assert torch.equal(tokens[untied], ref_tokens[untied])
    assert tokens[5] == 100 and margins[5] == 0 and margins[6] == float("inf")


def test_the_logits_of_an_inference_forward_outside_inference_mode():
    """An engine forward's logits are inference tensors; choosing from them outside inference mode must work (the
    choice writes into them and restores them)."""
    with torch.inference_mode():
        logits = torch.randn(3, 50)
    tokens, margins = sampler.greedy(logits)
    assert tokens == logits.argmax(-1).tolist() and min(margins) > 0
