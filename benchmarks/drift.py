"""What a benchmark's outputs are worth: GSM8K accuracy per engine, and how far each reduced-precision engine
drifts from an fp32 reference run of the same prompts.

Accuracy uses the GSM8K scorer of ``pytest_kvcm.accuracy`` (lm-eval's flexible extract: the last number of the
answer, cut at the first stop string), so a faster engine that answers worse shows in the same table.

Drift: greedy decoding in bf16 follows the fp32 path until a rounding difference flips one argmax, after which
the two texts part. Per engine: how many outputs equal the fp32 one, the share of the reference's tokens
produced before the first divergence, and the fp32 top1 - top2 logit margin where they part (a small margin is
a near tie that any rounding may flip; a large one means the engine computed something else). An EOS at the
end is not compared (engines differ in whether they return it), only where it comes.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass


def gsm8k_accuracy(texts: list[str], targets: list[str]) -> float:
    """Percent of ``texts`` whose flexible-extract answer equals the target (``target_answer`` normalised)."""
    from pytest_kvcm.accuracy.gsm8k import extract_answer, truncate_at_stop
    if not targets:
        return float("nan")
    ok = sum(extract_answer(truncate_at_stop(t), "flexible") == target for t, target in zip(texts, targets))
    return 100.0 * ok / len(targets)


def _tokens(out, eos: set[int]) -> list[int]:
    ids = [int(t) for t in out.token_ids]
    return ids[:-1] if ids and ids[-1] in eos else ids


@dataclass
class Drift:
    name: str
    num_prompts: int
    identical: int
    prefix_tokens: int             # reference tokens produced before each output's first divergence, summed
    reference_tokens: int
    first_positions: list[int]     # generated position of each divergence
    margins: list[float]           # fp32 margin at each divergence

    @property
    def prefix_share(self) -> float:
        return 100.0 * self.prefix_tokens / max(1, self.reference_tokens)

    def row(self) -> str:
        pos = statistics.median(self.first_positions) if self.first_positions else float("nan")
        med = statistics.median(self.margins) if self.margins else float("nan")
        ties = sum(m < 0.1 for m in self.margins)
        return (f"{self.name:>11} | {self.identical:5d}/{self.num_prompts:<5d} | {self.prefix_share:6.1f}% | "
                f"{pos:8.0f} | {med:9.3f} | {ties:5d} of {len(self.margins)}")


HEADER = ("     engine | equal fp32  | prefix | 1st div. | fp32 marg. | margin < 0.1\n"
          "            | (outputs)   | tokens | (median) | (median)   | (divergences)")


def drift(name: str, reference: list, outs: list, eos: set[int]) -> Drift:
    """``reference``: fp32 outputs with ``logits_margins``; ``outs``: one engine's outputs, same prompts."""
    d = Drift(name, len(reference), 0, 0, 0, [], [])
    for ref, out in zip(reference, outs):
        r, o = _tokens(ref, eos), _tokens(out, eos)
        d.reference_tokens += len(r)
        k = next((j for j in range(min(len(r), len(o))) if r[j] != o[j]), min(len(r), len(o)))
        if k == len(r) == len(o):
            d.identical += 1
            d.prefix_tokens += len(r)
            continue
        d.prefix_tokens += k
        d.first_positions.append(k)
        margins = list(ref.logits_margins)
        if k < len(margins):
            d.margins.append(float(margins[k]))
    return d
