"""Policies: the small decisions of the managers and the engine that a historic bug lived in, given at construction.

A decision is a named attribute of a ``Policy``: a *rule* (a function of what it is passed, no hidden state) or a
*setting* (a flag, a count or one of a few choices that the code branches on). Each is declared next to the code
that makes it, in a ``Decisions`` class of that module (``kvcm.policy._decisions``: ``rule``, ``setting``), so a
reader of a manager reads its arithmetic where it is used; the default is the correct behaviour, and ``DECISIONS``
says what each one decides and where upstream a bug lived in it. A manager, a reuse cache, an engine, a warmup or
estimation run takes ``policy=`` when it is built and keeps it (``self.policy.NAME(...)``); ``policy=None`` means
the active policy, ``active()``: ``DEFAULT`` unless a caller entered ``applied(p)`` (a ``contextvars.ContextVar``,
so a thread or task of its own keeps its own, and a forked process inherits its parent's). Nothing patches a
module: ``policy.replacing(name=...)`` returns a new policy, checking each replacement against what it replaces (a
rule's arguments, a setting's type and choices) when it is handed in, and a defect of ``pytest_kvcm.defects`` is
one such replacement, handed to one manager or applied for one run.

``OWNERS`` lists the modules that declare decisions: ``DECISIONS`` imports them when first read, so it is complete
whatever the caller imported (``suites/plugin/test_defect_policies.py`` checks the list against the code).
"""

from __future__ import annotations

import contextlib
import contextvars
import importlib
from collections.abc import Mapping

from ..errors import ConfigError
from ._decisions import REGISTRY, Decision, Decisions, Policy, rule, setting

__all__ = ["DECISIONS", "DEFAULT", "Decision", "Decisions", "OWNERS", "Policy", "active", "applied", "resolve",
           "rule", "setting"]

OWNERS: tuple[str, ...] = (
    "kvcm.attention_types", "kvcm.layer_groups", "kvcm.manager", "kvcm.dummies", "kvcm.manager_v1",
    "kvcm.manager_v2", "kvcm.deepseek_v4", "kvcm.storage_quota", "kvcm.estimation", "kvcm.warmup", "kvcm.draft_budget", "kvcm.parallel",
    "kvcm.plan_parallel", "kvcm.startup", "kvcm.free_queue", "kvcm.reuse.tree", "kvcm.reuse.cache",
    "kvcm.reuse.version_rules", "kvcm.reuse.retention", "kvcm.reuse.host_tier", "kvcm.reuse.host_level",
    "kvcm.reuse.api", "kvcm.reuse.transfers",
    "kvcm.eviction.arc", "kvcm.events.emitter", "kvcm.events.queue", "kvcm.engine.scheduler", "kvcm.engine.drafters",
    "kvcm.engine.reuse",
)
"""The modules with a ``Decisions`` class, a line each."""

_completed = False


def _complete() -> None:
    """Import every owner once, so every decision is declared."""
    global _completed
    if not _completed:
        _completed = True
        for module in OWNERS:
            importlib.import_module(module)


Policy._complete = staticmethod(_complete)


class _AllDecisions(Mapping):
    """``REGISTRY``, complete: every owner imported before it is read."""

    def __getitem__(self, name: str) -> Decision:
        _complete()
        return REGISTRY[name]

    def __iter__(self):
        _complete()
        return iter(REGISTRY)

    def __len__(self) -> int:
        _complete()
        return len(REGISTRY)


DECISIONS: Mapping[str, Decision] = _AllDecisions()   # name -> Decision, every owner's

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
