"""The registry's data types and the discovery of the catalogue's modules."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from dataclasses import dataclass, field
from typing import Callable, Mapping

import pytest

import kvcm.policy

_FIRST = ("seed",)  # the defects the project started from keep their place at the top of every listing
_NOT_DEFECT_MODULES = {"plugin"}


@dataclass(frozen=True)
class Defect:
    """One historic bug. ``replaces`` (decision name -> replacement) is the bug as a policy: ``policy()`` is a
    ``kvcm.policy.Policy`` with those decisions replaced, which ``--kvcm-inject`` applies for the run and a test
    may hand to one manager or engine. ``patch(monkeypatch)``, where a user's defect has one, patches what no
    policy reaches (a user's adapter); both may be given. ``upstream`` names the issue, PR or test where it was
    found or fixed; ``catchers`` are node-id prefixes of the tests expected to fail while it is injected;
    ``targets`` the ``--kvcm-target`` names it breaks (a user's adapter, say), which ``kvcm sensitivity`` runs."""

    name: str
    story: str
    patch: Callable[[pytest.MonkeyPatch], None] | None = None
    upstream: str = ""
    catchers: tuple[str, ...] = field(default_factory=tuple)
    targets: tuple[str, ...] = field(default_factory=tuple)
    replaces: Mapping[str, object] = field(default_factory=dict)

    def __post_init__(self):
        if self.patch is None and not self.replaces:
            raise ValueError(f"defect {self.name!r} neither replaces a decision nor patches anything")
        if self.replaces:
            kvcm.policy.DEFAULT.with_catalogued(**self.replaces)    # an unknown decision name is refused here, at once

    def policy(self, base: kvcm.policy.Policy | None = None) -> kvcm.policy.Policy:
        """``base`` (None: the active policy) with this defect's decisions replaced."""
        return kvcm.policy.resolve(base).with_catalogued(**self.replaces)


def defect(name: str, *, story: str, upstream: str, catchers=()) -> Callable[[Callable], Defect]:
    """Decorator: the function becomes a registered ``Defect`` of its module. A built-in defect is a function of
    no arguments returning the decisions it replaces (``{"lookup_length": lambda num_tokens: num_tokens}``), called
    once here; a function of one argument is a patch of a ``pytest.MonkeyPatch`` (a user's adapter: a built-in
    defect is always a policy, ``suites/plugin/test_defect_policies.py``)."""

    def wrap(fn: Callable) -> Defect:
        if not inspect.signature(fn).parameters:
            return Defect(name, story, None, upstream, tuple(catchers), replaces=dict(fn()))
        return Defect(name, story, fn, upstream, tuple(catchers))

    return wrap


class DefectRegistry:
    def __init__(self):
        self._defects: dict[str, Defect] = {}

    def add(self, d: Defect) -> None:
        if d.name in self._defects:
            raise ValueError(f"defect {d.name!r} is already registered")
        self._defects[d.name] = d

    def register(self, name: str, story: str, patch: Callable[[pytest.MonkeyPatch], None] | None = None, *,
                 upstream: str = "", catchers=(), targets=(), replaces: Mapping[str, object] | None = None) -> None:
        """A user's defect: ``patch(monkeypatch)`` for what it changes outside kvcm (an adapter), ``replaces`` for
        kvcm's decisions it replaces (``kvcm.policy``), or both."""
        self.add(Defect(name, story, patch, upstream, tuple(catchers), tuple(targets), dict(replaces or {})))

    def __getitem__(self, name: str) -> Defect:
        if name not in self._defects:
            import difflib

            near = difflib.get_close_matches(name, list(self._defects), n=3)
            hint = f"; did you mean {', '.join(near)}?" if near else ""
            raise pytest.UsageError(f"--kvcm-inject={name!r} is not a registered defect{hint} "
                                    f"(known: {', '.join(sorted(self._defects))})")
        return self._defects[name]

    def __contains__(self, name) -> bool:
        return name in self._defects

    def __iter__(self):
        return iter(self._defects.values())

    def __len__(self) -> int:
        return len(self._defects)

    def names(self) -> list[str]:
        return list(self._defects)


def _module_names() -> list[str]:
    from . import __path__ as here

    found = [m.name for m in pkgutil.iter_modules(here) if not m.name.startswith("_")
             and m.name not in _NOT_DEFECT_MODULES]
    return [n for n in _FIRST if n in found] + sorted(n for n in found if n not in _FIRST)


def builtin_defects() -> list[Defect]:
    """Every ``Defect`` defined at the top level of the package's public modules, in catalogue order."""
    out: list[Defect] = []
    for name in _module_names():
        module = importlib.import_module(f"{__package__}.{name}")
        out.extend(v for v in vars(module).values() if isinstance(v, Defect) and v not in out)
    return out
