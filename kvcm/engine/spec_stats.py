"""Acceptance figures of a drafter: how many of its drafts the target kept, per step and per draft position.

The mean acceptance length (tokens per target forward per sequence, the target's own token included) is what
decides whether speculation pays: a step costs about one plain step plus the drafting, and yields that many
tokens.
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class SpecStats:
    """Acceptance of one drafter: per verification step and per draft position."""
    name: str = ""
    steps: int = 0                          # verification steps (one per sequence per step)
    proposed: int = 0
    accepted: int = 0
    accepted_at: list[int] = field(default_factory=list)   # steps whose draft i was accepted
    proposed_at: list[int] = field(default_factory=list)   # steps that proposed a draft i
    steps_on: int = 0                       # engine steps that speculated
    steps_off: int = 0                      # engine steps run plain: above the cut-off, or the gate closed
    steps_gated: int = 0                    # of those, steps run plain because the acceptance gate had closed

    def record(self, num_draft: int, num_accepted: int) -> None:
        while len(self.proposed_at) < num_draft:
            self.proposed_at.append(0)
            self.accepted_at.append(0)
        self.steps += 1
        self.proposed += num_draft
        self.accepted += num_accepted
        for i in range(num_draft):
            self.proposed_at[i] += 1
            self.accepted_at[i] += i < num_accepted

    @property
    def mean_acceptance_length(self) -> float:
        """Tokens per target forward per sequence (accepted drafts + the target's own token); 1.0 = no help."""
        return (self.accepted + self.steps) / self.steps if self.steps else 0.0

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.proposed if self.proposed else 0.0

    @property
    def acceptance_by_position(self) -> list[float]:
        """Of the steps that verified a draft ``i``, the fraction that accepted it (every earlier one was too, by
        construction). A step with no drafts (the n-gram pool had none) counts in the acceptance length only."""
        return [a / p if p else 0.0 for a, p in zip(self.accepted_at, self.proposed_at)]

    def as_dict(self) -> dict:
        return {"drafter": self.name, "steps": self.steps, "mean_acceptance_length": self.mean_acceptance_length,
                "acceptance_rate": self.acceptance_rate, "acceptance_by_position": self.acceptance_by_position,
                "steps_on": self.steps_on, "steps_off": self.steps_off, "steps_gated": self.steps_gated}
