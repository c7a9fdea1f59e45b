"""The explorer's user-rule operations (``Config.user_rules``): every rule of ``kvcm.policy`` replaced, as a user
would, by one that answers as the default does but raises when ``SWITCH`` says so, and each operation tried with
its K-th rule raising (``rule-raises@K?``). The call must raise ``UserCallbackError`` naming the rule, with every
byte the search keeps as it was (kvcm/user_rules.py undoes it), or run fewer rules and go through."""

from __future__ import annotations

import functools

from kvcm.errors import UserCallbackError
from kvcm.user_rules import CHANGING_CALLS

from .ops import Driver, Refused, apply, first_of_each_kind

RULE_FAILS_AT = (1, 3, 8)


def with_failing_rule(ops: list) -> list:
    """The first operation of each kind again, with the K-th rule it runs raising, for each K of RULE_FAILS_AT."""
    return [(f"rule-raises@{k}?",) + op for op in first_of_each_kind(ops).values() for k in RULE_FAILS_AT]


class RuleSwitch:
    """Counts the rules the armed policy's managers run; armed with K, the K-th raises (once)."""

    def __init__(self):
        self.left = 0

    def tick(self, name: str) -> None:
        if self.left:
            self.left -= 1
            if not self.left:
                raise RuntimeError(f"the user's rule {name} failed")


SWITCH = RuleSwitch()


def armed_policy(base):
    """``base`` with every rule replaced, as a user would, by one that asks ``SWITCH`` first and then answers as
    ``base``'s does: the same manager, every rule the user's code."""
    from kvcm.policy import DECISIONS

    def armed(name, fn):
        @functools.wraps(fn)
        def rule(*args, **kwargs):
            SWITCH.tick(name)
            return fn(*args, **kwargs)

        return rule

    return base.replacing(**{n: armed(n, base.replaced.get(n, getattr(base, n)))
                             for n, d in DECISIONS.items() if d.kind == "rule"})


class _FirstCallArmed:
    """The manager, with ``SWITCH`` disarmed once its first changing call returns: an operation of several calls
    (a decode step) fails in its first, whose undoing leaves the state as it was before the operation."""

    def __init__(self, m):
        self._m, self._calls = m, 0

    def __getattr__(self, name):
        value = getattr(self._m, name)
        if name not in CHANGING_CALLS:
            return value

        def call(*args, **kwargs):
            if self._calls:
                SWITCH.left = 0
            self._calls += 1
            return value(*args, **kwargs)

        return call


def with_rule_that_fails(m, cfg, prompts, drv: Driver, op: tuple) -> Driver:
    """``op[1:]`` with its K-th rule raising: ``UserCallbackError`` naming the rule (the search then checks every
    byte), or fewer rules run and the operation goes through as it does unarmed."""
    SWITCH.left = int(op[0][len("rule-raises@"):-1])
    try:
        return apply(_FirstCallArmed(m), cfg, prompts, drv, op[1:])
    except UserCallbackError as exc:
        if not exc.callback.startswith("policy."):
            raise AssertionError(f"{op}: the error names {exc.callback!r}, not the rule that raised") from exc
        raise Refused from None
    finally:
        SWITCH.left = 0
