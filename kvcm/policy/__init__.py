"""Policies: the small decisions of the managers and the engine that a historic bug lived in, given at construction.

A decision is a named attribute of a ``Policy``: a *rule* (a function of what it is passed, no hidden state) or a
*setting* (a flag, a count or one of a few choices that the code branches on). The default of each is the correct
behaviour, and ``DECISIONS`` says what each one decides and where upstream a bug lived in it. A manager, a reuse
cache, an engine, a warmup or estimation run takes ``policy=`` when it is built and keeps it
(``self.policy.NAME(...)``); ``policy=None`` means the active policy, ``active()``: ``DEFAULT`` unless a caller
entered ``applied(p)`` (a ``contextvars.ContextVar``, so a thread or task of its own keeps its own, and a forked
process inherits its parent's). Nothing patches a module: ``policy.replacing(name=...)`` returns a new policy,
and a defect of ``pytest_kvcm.defects`` is one such replacement, handed to one manager or applied for one run.

The decisions are declared by subsystem, one module each: layer groups (``layers``), pool sizing (``sizing``),
DeepSeek-V4's bytes (``deepseek_v4``), dummies and warmup (``warmup``), block reuse (``reuse``), the host tier and
retention (``host_tier``), transfers in flight (``transfers``), the engine (``engine``).
"""

from __future__ import annotations

import contextlib
import contextvars

from ..errors import ConfigError
from ._decisions import Decision
from .deepseek_v4 import DeepseekV4Decisions
from .engine import EngineDecisions
from .host_tier import HostTierDecisions
from .layers import LayerDecisions
from .reuse import ReuseDecisions
from .sizing import SizingDecisions
from .transfers import TransferDecisions
from .warmup import WarmupDecisions

__all__ = ["DECISIONS", "DEFAULT", "Decision", "Policy", "active", "applied", "resolve"]

_SUBSYSTEMS = (LayerDecisions, SizingDecisions, DeepseekV4Decisions, WarmupDecisions, ReuseDecisions,
               HostTierDecisions, TransferDecisions, EngineDecisions)

DECISIONS: dict[str, Decision] = {}     # name -> Decision, every subsystem's, in declaration order
for _cls in _SUBSYSTEMS:
    for _name, _d in _cls.DECLARED.items():
        if _name in DECISIONS:
            raise AssertionError(f"decision {_name!r} declared twice")
        DECISIONS[_name] = _d


class Policy(*_SUBSYSTEMS):
    """Every decision, its default unless this policy replaces it. Immutable: ``replacing`` makes a new one."""

    def __setattr__(self, name, value):
        raise AttributeError(f"a Policy is immutable: use policy.replacing({name}=...)")

    def replacing(self, **changes) -> "Policy":
        """A policy with the named decisions replaced: a rule by a function of the same arguments, a setting by a
        value. An unknown name is refused, with the known ones."""
        for name, value in changes.items():
            decision = DECISIONS.get(name)
            if decision is None:
                raise ConfigError("policy", name, f"is not a decision of kvcm.policy (known: {', '.join(DECISIONS)})")
            decision.check(value)
        new = object.__new__(Policy)
        new.__dict__.update(self.__dict__)
        new.__dict__.update(changes)
        return new

    @property
    def replaced(self) -> dict:
        """The decisions this policy replaces, name -> replacement."""
        return dict(self.__dict__)

    def __eq__(self, other):
        if not isinstance(other, Policy):
            return NotImplemented
        return self.__dict__ == other.__dict__

    def __hash__(self):
        return hash(tuple(sorted(self.__dict__)))

    def __repr__(self) -> str:
        return f"Policy({', '.join(self.__dict__) or 'default'})" if self.__dict__ else "Policy(default)"


DEFAULT = Policy()
_ACTIVE: contextvars.ContextVar[Policy] = contextvars.ContextVar("kvcm.policy", default=DEFAULT)


def active() -> Policy:
    """The policy an object built with ``policy=None`` takes: the innermost ``applied``'s, else ``DEFAULT``."""
    return _ACTIVE.get()


def resolve(policy, field: str = "policy") -> Policy:
    """``policy`` itself when given (it must be a ``Policy``), else ``active()``."""
    if policy is None:
        return _ACTIVE.get()
    if not isinstance(policy, Policy):
        raise ConfigError(field, policy, "must be a kvcm.policy.Policy or None (the active one); build one with "
                                         "kvcm.policy.DEFAULT.replacing(...)")
    return policy


def of(obj) -> Policy:
    """The policy ``obj`` (a manager, say) was built with; ``active()`` for an object that keeps none (a test's
    stand-in, a user's adapter)."""
    policy = getattr(obj, "policy", None)
    return policy if isinstance(policy, Policy) else _ACTIVE.get()


@contextlib.contextmanager
def applied(policy: Policy):
    """Within the block, ``active()`` is ``policy``: what objects built with ``policy=None`` take."""
    token = _ACTIVE.set(resolve(policy))
    try:
        yield policy
    finally:
        _ACTIVE.reset(token)
