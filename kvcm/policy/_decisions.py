"""How a decision is declared, next to the code that makes it: ``@rule(what)`` for one computed from its arguments,
``setting(default, what)`` for a value the code branches on, both in a ``Decisions`` class of the owner's module.
Declaring one registers it (``REGISTRY``) and makes its default a plain class attribute of ``Policy``, so a decision
is looked up as an attribute (a replacement is an instance attribute): no descriptor of ours runs on the managers'
per-step paths. ``Policy.replacing`` checks each replacement against what it replaces when it is handed in."""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, Callable

from ..errors import ConfigError


@dataclass(frozen=True)
class Decision:
    """One decision: its name, what it decides (with the upstream issue, PR or test where a bug lived in it),
    ``kind`` (``"rule"``: a function of its arguments; ``"setting"``: a value), its default, the subsystem that
    makes it and the module it is declared in."""

    name: str
    what: str
    kind: str
    default: Any
    subsystem: str
    choices: tuple | None = None
    module: str = ""

    def check(self, value) -> None:
        """Refuse a replacement that cannot stand in for the default: a value for a rule, a function that cannot be
        called as the rule is (its arguments, positionally), a wrong type or an unknown choice for a setting."""
        if self.kind == "rule":
            if not callable(value):
                raise ConfigError(self.name, value, "is a rule of kvcm.policy: replace it with a function of the "
                                  "same arguments")
            expected = inspect.signature(self.default)
            try:
                given = inspect.signature(value)
            except (TypeError, ValueError):      # a builtin without a signature: trusted as it is
                return
            try:
                given.bind(*expected.parameters)
            except TypeError:
                raise ConfigError(self.name, value, f"must take the rule's arguments {_plain(expected)} "
                                  f"(positionally, as {self.module or 'its owner'} calls it); the replacement "
                                  f"takes {_plain(given)}") from None
        elif self.choices is not None:
            if value not in self.choices:
                raise ConfigError(self.name, value, f"must be one of {self.choices}")
        elif isinstance(self.default, bool) and type(value) is not bool:
            raise ConfigError(self.name, value, "must be True or False")
        elif type(self.default) is int and type(value) is not int:
            raise ConfigError(self.name, value, "must be an int")


def _plain(signature: inspect.Signature) -> str:
    """A signature as its parameters alone: ``(history, window)``."""
    empty = inspect.Parameter.empty
    return str(signature.replace(parameters=[p.replace(annotation=empty) for p in signature.parameters.values()],
                                 return_annotation=empty))


REGISTRY: dict[str, Decision] = {}
"""Every decision declared so far, name -> ``Decision`` (``kvcm.policy.DECISIONS`` is it, complete)."""


class Policy:
    """Every decision, its default unless this policy replaces it. Immutable: ``replacing`` makes a new one."""

    _complete: Callable[[], None] = staticmethod(lambda: None)     # kvcm.policy imports every owner
    immutable = True            # nothing a manager call could change: a snapshot (kvcm/user_rules.py) skips it

    def __setattr__(self, name, value):
        raise AttributeError(f"a Policy is immutable: use policy.replacing({name}=...)")

    def __getattr__(self, name):
        """Reached only for a decision whose owner is not imported yet (a default is a class attribute once it
        is): import the owners, then look again."""
        if name.startswith("__"):
            raise AttributeError(name)
        Policy._complete()
        if name not in REGISTRY:
            raise AttributeError(f"{name!r} is not a decision of kvcm.policy")
        return object.__getattribute__(self, name)

    def replacing(self, **changes) -> "Policy":
        """A policy with the named decisions replaced: a rule by a function of the same arguments, a setting by a
        value. An unknown name is refused, with the known ones. A rule replaced here is the user's code: a
        manager call in which it raises is undone and names it (``kvcm/user_rules.py``)."""
        return self._replacing(changes, user=True)

    def with_catalogued(self, **changes) -> "Policy":
        """``replacing`` for a catalogued defect's replacements (``pytest_kvcm.defects``): checked the same, not
        wrapped, so a defect acts exactly as the bug it reproduces did, raising or not."""
        return self._replacing(changes, user=False)

    def _replacing(self, changes: dict, user: bool) -> "Policy":
        from ..user_rules import UserRule

        Policy._complete()
        for name, value in changes.items():
            decision = REGISTRY.get(name)
            if decision is None:
                raise ConfigError("policy", name, f"is not a decision of kvcm.policy (known: {', '.join(REGISTRY)})")
            decision.check(value)
            if user and decision.kind == "rule" and not isinstance(value, UserRule):
                changes[name] = UserRule(name, value)
        new = object.__new__(Policy)
        new.__dict__.update(self.__dict__)
        new.__dict__.update(changes)
        return new

    @property
    def replaced(self) -> dict:
        """The decisions this policy replaces, name -> replacement (a user's rule as it was handed in)."""
        return {name: getattr(value, "__wrapped__", value) for name, value in self.__dict__.items()}

    @property
    def user_rules(self) -> bool:
        """Whether a rule of this policy is a user's code (``replacing``), so managers built with it undo a call
        in which it raises."""
        from ..user_rules import UserRule

        return any(isinstance(v, UserRule) for v in self.__dict__.values())

    def __eq__(self, other):
        if not isinstance(other, Policy):
            return NotImplemented
        return self.replaced == other.replaced

    def __hash__(self):
        return hash(tuple(sorted(self.__dict__)))

    def __repr__(self) -> str:
        return f"Policy({', '.join(self.__dict__) or 'default'})" if self.__dict__ else "Policy(default)"


class _Setting:
    def __init__(self, default, what: str, choices):
        self.default, self.what, self.choices = default, what, choices


def setting(default, what: str, *, choices: tuple | None = None):
    """A decision that is a value (a flag, a count, one of ``choices``); the class attribute becomes ``default``."""
    return _Setting(default, what, None if choices is None else tuple(choices))


def rule(what: str):
    """Decorator: a decision computed from its arguments (a static method; the policy passes no ``self``)."""

    def wrap(fn):
        fn.__kvcm_what__ = what
        return staticmethod(fn)

    return wrap


class Decisions:
    """Base of one owner's decisions (``SUBSYSTEM`` names what makes them). Subclassing registers each one: a name
    declared twice is refused, so two owners never disagree on a decision."""

    DECLARED: dict[str, Decision] = {}
    SUBSYSTEM = ""

    def __init_subclass__(cls, **kw):
        super().__init_subclass__(**kw)
        declared = {}
        for name, value in list(vars(cls).items()):
            if isinstance(value, _Setting):
                declared[name] = Decision(name, value.what, "setting", value.default, cls.SUBSYSTEM, value.choices,
                                          cls.__module__)
                setattr(cls, name, value.default)
                setattr(Policy, name, value.default)
            elif isinstance(value, staticmethod) and hasattr(value.__func__, "__kvcm_what__"):
                declared[name] = Decision(name, value.__func__.__kvcm_what__, "rule", value.__func__,
                                          cls.SUBSYSTEM, module=cls.__module__)
                setattr(Policy, name, value)
        for name, decision in declared.items():
            known = REGISTRY.get(name)
            if known is not None and known.module != decision.module:
                raise AssertionError(f"decision {name!r} declared twice ({known.module}, {decision.module})")
            REGISTRY[name] = decision
        cls.DECLARED = declared
