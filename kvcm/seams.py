"""The old spelling of a defect's decision, kept so that a defect written as ``seams.replace(mp, NAME, fn)`` still
reads as what it is: nothing here patches anything. The decisions are ``kvcm.policy``'s; the defect catalogue
(``pytest_kvcm.defects``) calls such a defect once with a recorder, which ``replace`` tells that the defect
replaces decision ``NAME`` by ``fn``, and the defect becomes that policy. A new defect returns its replacements
(``pytest_kvcm/defects/__init__.py`` shows how)."""

from __future__ import annotations


def replace(recorder, name: str, fn) -> None:
    """Tell ``recorder`` (the catalogue's) that the defect replaces the ``kvcm.policy`` decision ``name`` by ``fn``."""
    record = getattr(recorder, "replace_decision", None)
    if record is None:
        raise TypeError(f"kvcm.seams.replace({name!r}) patches nothing any more: a defect replaces decisions of "
                        "kvcm.policy; return them from the defect (def d(): return {name: fn}), register "
                        "replaces={...}, or hand kvcm.policy.DEFAULT.replacing(...) to what the test builds")
    record(name, fn)
