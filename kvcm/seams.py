"""Named seams: the small decisions of the managers and the engine that a historic bug lived in.

Code that makes one of these decisions calls it through this module (``seams.NAME(...)``), never through a
private method, so that a defect of ``pytest_kvcm.defects`` replaces exactly one named function with
``seams.replace(monkeypatch, "NAME", fn)`` and says in a few lines what changes, without copying a body or
reaching into private names. Each seam is a plain function of what it is passed (no hidden manager state), and
``SEAMS`` lists them all, so a test can check that every defect names a seam that exists.

A seam is looked up at call time (an attribute of this module), which costs one dictionary lookup: cheap enough
for the per-step paths, where the engine calls them.
"""

from __future__ import annotations

import sys

SEAMS: dict[str, str] = {}   # name -> what the decision is, filled by ``seam``


def seam(what: str):
    """Decorator: register a module-level function of this module as the seam named after it."""

    def wrap(fn):
        SEAMS[fn.__name__] = what
        return fn

    return wrap


def replace(monkeypatch, name: str, fn) -> None:
    """Put ``fn`` in place of the seam ``name`` for as long as ``monkeypatch`` lives (a defect's patch)."""
    if name not in SEAMS:
        raise KeyError(f"{name!r} is not a seam of kvcm.seams (known: {', '.join(sorted(SEAMS))})")
    monkeypatch.setattr(sys.modules[__name__], name, fn)
