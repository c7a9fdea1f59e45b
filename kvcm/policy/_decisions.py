"""How a subsystem declares its decisions: ``@rule(what)`` for one computed from its arguments, ``setting(default,
what)`` for a value the code branches on. ``Decisions`` collects both per class; ``kvcm.policy.Policy`` joins
the subsystems' classes, so a decision is looked up as a plain attribute (a class attribute until a policy
replaces it on the instance): no descriptor of ours runs on the managers' per-step paths."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError


@dataclass(frozen=True)
class Decision:
    """One decision: its name, what it decides (with the upstream issue, PR or test where a bug lived in it),
    ``kind`` (``"rule"``: a function of its arguments; ``"setting"``: a value) and its default."""

    name: str
    what: str
    kind: str
    default: Any
    subsystem: str
    choices: tuple | None = None

    def check(self, value) -> None:
        """Refuse a replacement that cannot stand in for the default (a value for a rule, a wrong type or an
        unknown choice for a setting)."""
        if self.kind == "rule":
            if not callable(value):
                raise ConfigError(self.name, value, "is a rule of kvcm.policy: replace it with a function of the "
                                  "same arguments")
        elif self.choices is not None:
            if value not in self.choices:
                raise ConfigError(self.name, value, f"must be one of {self.choices}")
        elif isinstance(self.default, bool) and type(value) is not bool:
            raise ConfigError(self.name, value, "must be True or False")
        elif type(self.default) is int and type(value) is not int:
            raise ConfigError(self.name, value, "must be an int")


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
    """Base of one subsystem's decisions; ``DECLARED`` is name -> ``Decision`` for the class's own."""

    DECLARED: dict[str, Decision] = {}
    SUBSYSTEM = ""

    def __init_subclass__(cls, **kw):
        super().__init_subclass__(**kw)
        declared = {}
        for name, value in list(vars(cls).items()):
            if isinstance(value, _Setting):
                declared[name] = Decision(name, value.what, "setting", value.default, cls.SUBSYSTEM, value.choices)
                setattr(cls, name, value.default)
            elif isinstance(value, staticmethod) and hasattr(value.__func__, "__kvcm_what__"):
                declared[name] = Decision(name, value.__func__.__kvcm_what__, "rule", value.__func__, cls.SUBSYSTEM)
        cls.DECLARED = declared
