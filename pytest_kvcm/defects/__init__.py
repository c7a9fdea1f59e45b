"""The defect catalogue: real KV-cache bugs of the field, put back into ``kvcm`` (or an adapter) for one run.

``pytest --kvcm-inject=NAME`` applies one registered defect so a suite can be shown to catch it;
``pytest --kvcm-list-defects`` prints each with its upstream reference; ``kvcm sensitivity`` proves every one is
caught. ``kvcm`` itself has no bug switches that a run flips behind its back: each defect is a *policy*, the few
decisions of ``kvcm.policy`` it replaces (``kvcm.policy.DECISIONS`` lists them, each with what it decides and the
upstream bug it once held). ``--kvcm-inject`` enters ``kvcm.policy.applied(defect.policy())`` for the run; a test
may instead hand ``defect.policy()`` to one manager (``KVCacheManagerV1(..., policy=...)``,
``create_kv_cache_manager(..., policy=...)``) or one engine (``LLM(..., policy=...)``), and nothing else changes.

Adding defects
--------------
One module per source (a tracker, a project, a family of bugs). Every public module of this package is imported
in turn (``seed`` first, the rest by name) and every ``Defect`` at its top level is registered, in the order the
module defines them. A new module needs nothing else::

    # pytest_kvcm/defects/my_source.py
    from ._registry import defect

    @defect("short-name", upstream="vLLM PR #12345",
            story="what broke and what a user saw, in one line",
            catchers=("suites/managers/test_x.py::test_y",))   # tests expected to fail with it injected
    def short_name():
        return {"lookup_length": lambda num_tokens: num_tokens}   # the decisions the bug got wrong

A built-in defect replaces decisions of ``kvcm.policy`` and nothing else (``suites/plugin/test_defect_policies.py``):
a rule by a function of the same arguments (checked when it is handed in), a setting by a value. Where the decision a
bug lived in is not one yet, make it one in the module that makes it (a named rule, or a setting the code branches
on, in that module's ``Decisions`` class), asked by the code through the policy it was built with, rather than
patching a private method or restating its body. A function of one argument
is a patch of a ``pytest.MonkeyPatch``, which the test above refuses for a built-in defect.

``catchers`` are node-id prefixes; ``kvcm sensitivity`` runs just those (fast mode) and fails unless each
defect is caught by at least two tests. Users register defects of their own from a plugin or ``conftest.py``
through the ``pytest_kvcm_register_defects(registry)`` hook with ``registry.register(name, story, patch,
upstream=..., catchers=..., replaces=...)``: ``replaces`` for kvcm's decisions, ``patch(monkeypatch)`` for what
no policy reaches (their own adapter, which is theirs to patch); ``--kvcm-inject`` applies both and undoes them
when the run ends.
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
