"""Every built-in defect is a policy: the few decisions of ``kvcm.policy`` it replaces, no patch. A decision is
named and documented, so a refactoring that keeps the decisions keeps every defect meaningful, and a defect says
in its code which decision it breaks. A policy handed to one manager changes that manager and no other."""

from __future__ import annotations

import inspect

import pytest

import kvcm
import kvcm.policy
from kvcm import KvCacheConfig, create_kv_cache_manager
from kvcm.errors import ConfigError
from pytest_kvcm.defects import Defect, builtin_defects


def test_every_builtin_defect_replaces_existing_decisions_and_patches_nothing():
    bad = {d.name: (d.patch, sorted(d.replaces)) for d in builtin_defects()
           if d.patch is not None or not d.replaces or set(d.replaces) - set(kvcm.policy.DECISIONS)}
    assert not bad, f"built-in defects that patch, or replace no or unknown decisions: {bad}"


def test_a_defect_that_patches_is_reported():
    """The check can fail: a defect written as a patch (a user's may be) is told apart from a policy."""
    d = Defect("patcher", "patches a method", lambda mp: mp.setattr(kvcm.KVCacheManagerV2, "_clamp", None))
    assert d.patch is not None and not d.replaces


def test_every_decision_is_documented_with_its_default():
    undocumented = [name for name, d in kvcm.policy.DECISIONS.items() if len(d.what) < 40 or not d.subsystem]
    assert not undocumented
    assert all(getattr(kvcm.policy.DEFAULT, name) is d.default for name, d in kvcm.policy.DECISIONS.items())


class _Probe:
    """An argument no rule can compute with: a rule that returns one is handing its input back."""

    def __getattr__(self, name):
        raise TypeError(name)


def _returned_argument(rule, args) -> int | None:
    try:
        out = rule(*args)
    except Exception:
        return None
    return next((i for i, a in enumerate(args) if out is a and a is not None), -1)


def test_no_decision_only_returns_its_input():
    """A rule that hands back the same one of its arguments untouched, whatever it is given, exists only to be
    replaced: such a decision is a setting the code branches on. The probe: distinct objects as arguments, then
    each argument in turn None; a rule returning the same argument every time is flagged."""
    identity = []
    for name, d in kvcm.policy.DECISIONS.items():
        if d.kind != "rule":
            continue
        n = len(inspect.signature(d.default).parameters)
        calls = [[_Probe() for _ in range(n)]] + [[None if i == j else _Probe() for i in range(n)] for j in range(n)]
        returned = {_returned_argument(d.default, args) for args in calls} - {None}
        if len(returned) == 1 and returned != {-1}:
            identity.append(name)
    assert not identity


def test_the_identity_check_can_fail():
    assert _returned_argument(lambda tokens: tokens, [_Probe()]) == 0


def test_replacing_refuses_an_unknown_name_and_lists_the_known_ones():
    with pytest.raises(ConfigError, match="lookup_lenght.*known: .*lookup_length"):
        kvcm.policy.DEFAULT.replacing(lookup_lenght=lambda num_tokens: num_tokens)
    with pytest.raises(ConfigError, match="prefill_after_hit"):
        kvcm.policy.DEFAULT.replacing(prefill_after_hit="somewhere")
    with pytest.raises(ConfigError, match="evict_with_descendants"):
        kvcm.policy.DEFAULT.replacing(evict_with_descendants=lambda: False)   # a setting takes a value


def test_replacing_leaves_the_policy_it_came_from():
    p = kvcm.policy.DEFAULT.replacing(lookup_length=lambda num_tokens: num_tokens)
    assert p.lookup_length(5) == 5 and kvcm.policy.DEFAULT.lookup_length(5) == 4
    assert p.replaced.keys() == {"lookup_length"} and not kvcm.policy.DEFAULT.replaced


@pytest.mark.parametrize("kvcm_version", ["v1", "v2"])
def test_a_defect_handed_to_one_manager_changes_that_manager_only(kvcm_version):
    """``available-tokens-ignore-draft`` leaves the draft tokens out of the available tokens: the manager built
    with it answers that many more, the one built beside it with the default does not."""
    d = next(d for d in builtin_defects() if d.name == "available-tokens-ignore-draft")
    cfg = KvCacheConfig(max_tokens=256, tokens_per_block=4)
    spec = kvcm.load_spec("llama-3-8b")
    broken = create_kv_cache_manager(kvcm_version, spec, cfg, max_batch_size=4, max_seq_len=1024, max_draft_len=4,
                                     device="meta", policy=d.policy())
    plain = create_kv_cache_manager(kvcm_version, spec, cfg, max_batch_size=4, max_seq_len=1024, max_draft_len=4,
                                    device="meta")

    def available(mgr):
        return mgr.get_num_available_tokens(token_num_upper_bound=1024, max_num_draft_tokens=4)

    assert available(broken) == available(plain) + 4
    assert plain.policy is kvcm.policy.active() and broken.policy == d.policy()


def test_an_applied_policy_is_what_a_manager_built_inside_takes():
    d = next(d for d in builtin_defects() if d.name == "reuse-last-token-matched")
    cfg = KvCacheConfig(max_tokens=256, tokens_per_block=4)
    with kvcm.policy.applied(d.policy()) as p:
        inside = create_kv_cache_manager("v2", kvcm.load_spec("llama-3-8b"), cfg, max_batch_size=4, max_seq_len=64,
                                         device="meta")
    outside = create_kv_cache_manager("v2", kvcm.load_spec("llama-3-8b"), cfg, max_batch_size=4, max_seq_len=64,
                                      device="meta")
    assert inside.policy is p and outside.policy is kvcm.policy.DEFAULT


def test_a_rule_replaced_by_a_function_of_other_arguments_is_refused_when_handed_in():
    """A replacement is checked against the signature of the rule it replaces when it is handed in (issue 52): a
    function that cannot be called as the rule is, with its arguments positionally, is one ConfigError naming the
    rule, the rule's signature and the replacement's, before any manager is built with it (it used to surface as a
    TypeError deep inside the first call, or never on a path a run did not reach)."""
    with pytest.raises(ConfigError) as exc:
        kvcm.policy.DEFAULT.replacing(window_first_token=lambda history: history)
    message = str(exc.value)
    assert "window_first_token" in message and "arguments (history, window)" in message
    assert "the replacement takes (history)" in message
    assert "\n" not in message
    with pytest.raises(ConfigError, match=r"clamp_blocks.*\(num_blocks, num_free, short_blocks\).*"
                                          r"\(num_blocks, num_free, short_blocks, extra\)"):
        kvcm.policy.DEFAULT.replacing(clamp_blocks=lambda num_blocks, num_free, short_blocks, extra: 0)
    # what can stand in is accepted: other names, defaults, *args
    p = kvcm.policy.DEFAULT.replacing(window_first_token=lambda h, w, extra=0: h - w,
                                      clamp_blocks=lambda *args: 0)
    assert p.window_first_token(10, 4) == 6 and p.clamp_blocks(1, 2, 3) == 0


def test_a_user_defect_of_the_wrong_arity_is_refused_at_registration():
    from pytest_kvcm.defects import DefectRegistry

    with pytest.raises(ConfigError, match="lookup_length"):
        DefectRegistry().register("mine", "a lookup of the whole prompt", upstream="here",
                                  replaces={"lookup_length": lambda: 0})


def test_every_module_that_declares_decisions_is_listed_as_an_owner():
    """``DECISIONS`` is complete because ``kvcm.policy.OWNERS`` imports every module that declares one; a module
    that declares decisions but is missing there would leave them out of ``DECISIONS`` until something imported it."""
    import ast
    from pathlib import Path

    root = Path(kvcm.__file__).resolve().parent
    declaring = set()
    for path in root.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and any(getattr(b, "id", None) == "Decisions" for b in node.bases):
                declaring.add(".".join(("kvcm", *path.relative_to(root).with_suffix("").parts)))
    assert declaring == set(kvcm.policy.OWNERS)
    assert {d.module for d in kvcm.policy.DECISIONS.values()} == set(kvcm.policy.OWNERS)
