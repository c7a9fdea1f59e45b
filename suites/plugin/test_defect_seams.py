"""Every built-in defect is a few lines that replace named seams of ``kvcm.seams`` (``seams.replace``): none
patches a private method, restates a body or looks its target up in ``sys.modules``, so a refactoring that keeps
the seams keeps every defect meaningful, and a defect says in its code which decision it breaks."""

import kvcm.seams
from pytest_kvcm.defects import builtin_defects


class _Recorder:
    """A stand-in for ``pytest.MonkeyPatch`` that records what a defect's patch would set."""

    def __init__(self):
        self.set = []

    def setattr(self, target, name, value=None, raising=True):
        self.set.append((getattr(target, "__name__", repr(target)), name))

    def setitem(self, mapping, name, value):
        self.set.append(("<mapping>", name))

    def __getattr__(self, name):        # delattr, setenv, syspath_prepend ...: recorded as not a seam
        return lambda *a, **k: self.set.append((f"<{name}>", a))


def _replaced():
    out = {}
    for d in builtin_defects():
        rec = _Recorder()
        d.patch(rec)
        out[d.name] = rec.set
    return out


def test_every_builtin_defect_replaces_seams_and_nothing_else():
    bad = {name: sets for name, sets in _replaced().items()
           if not sets or any(mod != "kvcm.seams" or attr not in kvcm.seams.SEAMS for mod, attr in sets)}
    assert not bad, f"defects that set something other than a kvcm.seams seam (use seams.replace): {bad}"


def test_a_patch_outside_the_seams_is_reported():
    """The check can fail: a defect that sets a manager's method is named."""
    rec = _Recorder()
    rec.setattr(kvcm.KVCacheManagerV2, "_clamp", None)
    assert rec.set == [("KVCacheManagerV2", "_clamp")]
