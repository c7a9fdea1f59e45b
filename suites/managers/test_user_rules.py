"""A rule handed to ``kvcm.policy.replacing`` is the user's code: a manager call in which it raises is undone and
names it (issue 52, kvcm/user_rules.py).

Before, ``Policy.replacing`` checked a rule's signature when it was handed in, and nothing more: an admission
whose last rule (``window_first_token``) raised left its cache match claimed by a request that was never made,
and the error was the user's raw exception. "As it was" is checked
on everything the manager keeps, pickled, as ``test_user_clock.py`` does for clocks; the explorer checks it after
every operation of its user-rule configurations (``rule-raises@K?``).
"""

from __future__ import annotations

import pickle

import pytest

import kvcm
import kvcm.policy
import kvcm.user_rules
from kvcm import versions
from kvcm.config import KvCacheConfig
from kvcm.errors import ConfigError, UserCallbackError
from kvcm.model_spec import LayerSpec, ModelSpec
from kvcm.user_rules import UserRule
from pytest_kvcm.defects import builtin_defects

SPEC = ModelSpec((LayerSpec(1, 64, "bfloat16", 6, model_layer=0), LayerSpec(1, 64, "bfloat16", None, model_layer=1)),
                 name="window-full")
PROMPT = list(range(1, 11))


class Armed:
    """Rule ``name`` as the default computes it; while ``left`` counts down to 0 on the rules a call runs, the
    rule met at 0 raises."""

    left = 0
    error = RuntimeError

    def __init__(self, name: str):
        self.name = name

    def __call__(self, *args):
        if Armed.left:
            Armed.left -= 1
            if not Armed.left:
                raise Armed.error(f"the user's {self.name} failed")
        return getattr(kvcm.policy.DEFAULT, self.name)(*args)


def _every_rule_armed():
    return kvcm.policy.DEFAULT.replacing(**{n: Armed(n) for n, d in kvcm.policy.DECISIONS.items() if d.kind == "rule"})


def _manager(version: str, policy):
    cfg = KvCacheConfig(tokens_per_block=4, max_tokens=24, enable_block_reuse=True, enable_partial_reuse=True,
                        copy_on_partial_reuse=True, host_cache_size=2048)
    return kvcm.create_kv_cache_manager(version, SPEC, cfg, max_batch_size=4, max_seq_len=32, policy=policy)


def _kept(mgr) -> bytes:
    return pickle.dumps((mgr.pools, mgr._seqs, mgr.stale_released, mgr._reuse, mgr._reuse_totals, mgr._events))


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_a_hit_whose_last_rule_raises_leaves_the_manager_as_it_was(version, monkeypatch):
    """An admission that matches the cache runs eight rules (V1; V2 eleven), the last (``window_first_token``) after
    the match is claimed. Failing at each, the manager is as before; without the undo, the last leaves the
    claim behind (the first check below, run with ``install`` taken out, proves the test can see it)."""
    def admission_failing_at(k):
        mgr = _manager(version, _every_rule_armed())
        mgr.add_sequence("a", PROMPT)
        mgr.free_resources("a")
        mgr.add_sequence("b", [9] * 13)
        mgr.free_resources("b")
        pools, before = list(mgr.pools), _kept(mgr)
        Armed.left = k
        try:
            mgr.add_sequence("c", PROMPT)
        except UserCallbackError as exc:
            assert exc.callback.startswith("policy.") and isinstance(exc.__cause__, RuntimeError)
            assert all(a is b for a, b in zip(mgr.pools, pools))       # what an engine holds: the same objects
            return _kept(mgr) == before
        finally:
            Armed.left = 0
        return None                                                        # fewer than k rules: it went through

    with monkeypatch.context() as m:
        m.setattr(kvcm.user_rules, "install", lambda manager: None)
        undone = [admission_failing_at(k) for k in range(1, 13)]
    assert False in undone                            # without the undo, a failure leaves the claim behind
    undone = [admission_failing_at(k) for k in range(1, 13)]
    assert None in undone and all(u is not False for u in undone), undone


def _lookup_without_table(num_tokens):
    raise KeyError("no table")


def test_the_error_names_the_rule_and_keeps_what_it_raised():
    mgr = _manager("v2", kvcm.policy.DEFAULT.replacing(lookup_length=_lookup_without_table))
    before = _kept(mgr)
    with pytest.raises(UserCallbackError) as info:
        mgr.add_sequence("a", PROMPT)
    assert info.value.callback == "policy.lookup_length" and isinstance(info.value.__cause__, KeyError)
    assert _kept(mgr) == before and not mgr.has_request("a")


def test_kvcm_s_own_error_from_a_rule_passes_as_it_is():
    """A rule may refuse as its default does (``checked_dummy_call`` raises ``ConfigError``): not the user's
    failure, and a refusal changes nothing already."""
    def strict(request_ids, token_nums, is_gen, max_num_draft_tokens, kv_reserve_draft_tokens, max_seq_len):
        raise ConfigError("token_nums", token_nums, "must be below 2 here")

    mgr = _manager("v1", kvcm.policy.DEFAULT.replacing(checked_dummy_call=strict))
    with pytest.raises(ConfigError, match="token_nums"):
        mgr.add_dummy_requests(["w"], [3])


def test_a_default_or_catalogued_policy_costs_nothing():
    """Only a user's rule makes a manager snapshot its calls: the default policy and a defect's replacements (which
    must act as the bug did) build the version's own class."""
    assert type(_manager("v1", None)) is versions.get("v1").cls
    defect = next(d for d in builtin_defects() if any(callable(v) for v in d.replaces.values()))
    policy = defect.policy(kvcm.policy.DEFAULT)
    assert not policy.user_rules and not any(isinstance(v, UserRule) for v in policy.__dict__.values())
    user = _manager("v1", kvcm.policy.DEFAULT.replacing(release_block=Armed("release_block")))
    assert type(user) is not versions.get("v1").cls and isinstance(user, versions.get("v1").cls)
    assert user.kvcm_version == "v1"


def test_a_policy_says_the_rule_it_was_handed():
    fn = Armed("release_block")
    policy = kvcm.policy.DEFAULT.replacing(release_block=fn)
    assert policy.replaced == {"release_block": fn} and policy.user_rules
    assert policy == kvcm.policy.DEFAULT.replacing(release_block=fn)
    assert policy.replacing(evict_with_descendants=False).replaced["release_block"] is fn


def _refusal(message):
    return ConfigError("token_nums", 3, message)


def test_a_rule_refusing_as_kvcm_does_mid_call_is_undone_too():
    """A rule that raises kvcm's own error (here the last rule of an admission with a hit) passes it as it is, and
    the call is still undone: all or nothing does not depend on what the user's code raised."""
    mgr = _manager("v2", _every_rule_armed())
    mgr.add_sequence("a", PROMPT)
    mgr.free_resources("a")
    before = _kept(mgr)
    Armed.left, Armed.error = 10, _refusal
    try:
        with pytest.raises(ConfigError, match="window_first_token"):
            mgr.add_sequence("c", PROMPT)
    finally:
        Armed.left, Armed.error = 0, RuntimeError
    assert _kept(mgr) == before and not mgr.has_request("c")
