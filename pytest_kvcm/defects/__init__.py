"""The defect catalogue: real KV-cache bugs of the field, put back into ``kvcm`` (or an adapter) for one run.

``pytest --kvcm-inject=NAME`` applies one registered defect so a suite can be shown to catch it;
``pytest --kvcm-list-defects`` prints each with its upstream reference; ``kvcm sensitivity`` proves every one is
caught. ``kvcm`` itself has no bug switches: each defect is a monkeypatch that lives here.

Adding defects
--------------
One module per source (a tracker, a project, a family of bugs). Every public module of this package is imported
in turn (``seed`` first, the rest by name) and every ``Defect`` at its top level is registered, in the order the
module defines them. A new module needs nothing else::

    # pytest_kvcm/defects/my_source.py
    from kvcm import seams

    from ._registry import defect

    @defect("short-name", upstream="vLLM PR #12345",
            story="what broke and what a user saw, in one line",
            catchers=("suites/managers/test_x.py::test_y",))   # tests expected to fail with it injected
    def short_name(mp):                                          # mp: a pytest.MonkeyPatch, undone after the run
        seams.replace(mp, "the_seam", lambda ...: ...)          # the one decision the bug got wrong

A built-in defect replaces seams of ``kvcm/seams.py`` and nothing else (``suites/plugin/test_defect_seams.py``):
where the decision a bug lived in is not a seam yet, make it one there, called by the code that makes it, rather
than patching a private method, restating its body or looking a name up in ``sys.modules``.

``catchers`` are node-id prefixes; ``kvcm sensitivity`` runs just those (fast mode) and fails unless each
defect is caught by at least two tests. Users register defects of their own from a plugin or ``conftest.py``
through the ``pytest_kvcm_register_defects(registry)`` hook with ``registry.register(name, story, patch,
upstream=..., catchers=...)``.
"""

from ._registry import Defect, DefectRegistry, builtin_defects, defect

__all__ = ["Defect", "DefectRegistry", "build_registry", "builtin_defects", "defect"]


def build_registry(pluginmanager=None) -> DefectRegistry:
    """The built-in catalogue plus whatever plugins and conftest files add through the hook."""
    registry = DefectRegistry()
    for d in builtin_defects():
        registry.add(d)
    if pluginmanager is not None:
        pluginmanager.hook.pytest_kvcm_register_defects(registry=registry)
    return registry
