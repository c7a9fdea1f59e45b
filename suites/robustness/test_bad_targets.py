"""Third-party targets with something wrong: one usage error at start-up naming the hook (plugin or conftest.py,
file and line) or the target and what is wrong with it; never an ``INTERNALERROR``, a silent fallback, or a
failure deep inside a suite.

Before, a ``pytest_kvcm_register_targets`` that raised was an ``INTERNALERROR``; one that returned something, or
registered a non-callable, a non-string name or a name ``--kvcm-target`` cannot spell, passed silently (the
entry failed later, if ever); ``--kvcm-target=`` fell back to the default targets and duplicates ran twice; an
adapter property that raised was an ``INTERNALERROR``.
"""

from __future__ import annotations

import pytest

ADAPTER = '''
from pytest_kvcm.targets.contract import KVCacheTarget


class Mine(KVCacheTarget):
    def __init__(self, spec):
        super().__init__(spec)
        self.page_size, self.total_pages, self.held = spec.page_size, spec.num_pages, {}

    def free_pages(self):
        return self.total_pages - sum(self.held.values())

    def held_pages(self, rid):
        return {"full": self.held[rid]}

    def _allocate(self, rid, n, lookahead):
        self.held[rid] = -(-(n + lookahead) // self.page_size)
        return True

    def _grow(self, rid, have, n, lookahead):
        self.held[rid] = -(-(have + n + lookahead) // self.page_size)
        return True

    def _free(self, rid):
        del self.held[rid]
'''
TEST = '''
def test_uses_a_target(kvcm_target):
    pass
'''


@pytest.fixture
def run(pytester):
    pytester.makeini("[pytest]\naddopts = -p no:cacheprovider -p no:randomly\n")
    pytester.makepyfile(test_t=TEST)

    def go(hook_body: str | None, *args):
        body = ADAPTER + (f"\n\ndef pytest_kvcm_register_targets(registry):\n{hook_body}\n" if hook_body else "")
        pytester.makeconftest(body)
        return pytester.runpytest_inprocess(*args)

    return go


def _usage_error(result) -> str:
    text = result.stdout.str() + result.stderr.str()
    assert result.ret == pytest.ExitCode.USAGE_ERROR, text
    assert "INTERNALERROR" not in text and "Traceback" not in text and " passed" not in text
    return text


HOOKS = [  # (case id, the hook's body, --kvcm-target, a fragment of the usage error)
    ("hook_raises", "    raise RuntimeError('no engine here')", None,
     "pytest_kvcm_register_targets of plugin '{conftest}' ({conftest}:"),
    ("hook_raises_message", "    raise KeyError('cfg')", None, "raised KeyError: 'cfg'"),
    ("hook_returns_a_list", "    return [Mine]", None, "returned list [<class 'conftest.Mine'>]; it adds targets"),
    ("hook_returns_a_dict", "    return {'mine': Mine}", None, "returned dict {'mine': <class 'conftest.Mine'>}"),
    ("non_callable", "    registry['mine'] = 5", None, "target 'mine': the factory must be callable (PoolSpec -> "
                                                       "KVCacheTarget), not int (5)"),
    ("non_callable_instance", "    registry['mine'] = Mine.__new__(Mine)", None, "target 'mine': the factory must be "
                                                                                 "callable"),
    ("name_an_int", "    registry[3] = Mine", None, "a target name must be a string, not int (3)"),
    ("name_a_tuple", "    registry[('a', 'b')] = Mine", None, "a target name must be a string, not tuple"),
    ("name_empty", "    registry[''] = Mine", None, "target name '' cannot be given to --kvcm-target"),
    ("name_with_comma", "    registry['a,b'] = Mine", None, "target name 'a,b' cannot be given to --kvcm-target"),
    ("name_with_space", "    registry['my target'] = Mine", None, "target name 'my target' cannot be given"),
    ("name_all", "    registry['all'] = Mine", None, "target name 'all' cannot be given to --kvcm-target"),
    ("removes_builtins", "    registry.clear()", None, "removed target(s) kvcm-v1, kvcm-v2, kvcm-v4, vllm, sglang"),
    ("replaces_a_builtin_unselected", "    registry['vllm'] = None", "kvcm-v1",
     "target 'vllm': the factory must be callable"),
    # adapters whose attributes are wrong in ways the landed check did not read
    ("adapter_property_raises", "    registry['mine'] = type('Bad', (Mine,), {'page_size': property(lambda s: 1 / 0, "
                                "lambda s, v: None)})", "mine",
     "--kvcm-target=mine: adapter Bad, page_size: reading page_size raised ZeroDivisionError: division by zero"),
    ("adapter_differences_a_list", "    registry['mine'] = type('Bad', (Mine,), {'differences': ['lookahead']})",
     "mine", "adapter Bad, differences: differences must be a dict of check name -> reason"),
    ("adapter_batch_returns_none", "    registry['mine'] = type('Bad', (Mine,), {'allocate_batch': "
                                   "lambda s, rids, nums, lookahead=0: None})", "mine",
     "adapter Bad, allocate_batch: allocate_batch must return a bool"),
]


@pytest.mark.parametrize("body, target, fragment", [c[1:] for c in HOOKS], ids=[c[0] for c in HOOKS])
def test_bad_registration_is_one_usage_error_naming_the_hook(pytester, run, body, target, fragment):
    text = _usage_error(run(body, *([f"--kvcm-target={target}"] if target else [])))
    assert fragment.replace("{conftest}", str(pytester.path / "conftest.py")) in text


OPTIONS = [  # (case id, arguments, fragment)
    ("target_empty", ["--kvcm-target="], "--kvcm-target='': names no target; give one or more of kvcm-v1"),
    ("target_blank", ["--kvcm-target= "], "--kvcm-target=' ': names no target"),
    ("target_only_commas", ["--kvcm-target=,"], "--kvcm-target=',': names no target"),
    ("target_empty_between", ["--kvcm-target=kvcm-v1,,kvcm-v2"], "an empty name between commas"),
    ("target_trailing_comma", ["--kvcm-target=kvcm-v1,"], "--kvcm-target='kvcm-v1,': an empty name between commas"),
    ("ini_target_empty", ["-o", "kvcm_target="], "ini kvcm_target='': names no target"),
]


@pytest.mark.parametrize("args", [c[1] for c in OPTIONS], ids=[c[0] for c in OPTIONS])
def test_empty_target_option_is_a_usage_error(run, args):
    fragment = next(c[2] for c in OPTIONS if c[1] == args)
    assert fragment in _usage_error(run(None, *args))


@pytest.mark.parametrize("value, expected", [
    ("kvcm-v1,kvcm-v1", ["kvcm-v1"]),
    ("mine,kvcm-v2,mine", ["mine", "kvcm-v2"]),
    ("all,kvcm-v1", ["kvcm-v1", "kvcm-v2", "kvcm-v4", "vllm", "sglang", "hf", "hf-5.17", "trtllm", "mine"]),
], ids=["duplicate_builtin", "duplicate_own", "all_in_a_list"])
def test_duplicates_run_once_and_all_means_all(run, value, expected):
    result = run("    registry['mine'] = Mine", f"--kvcm-target={value}", "--collect-only", "-q")
    ids = [line.split("[", 1)[1].rstrip("]") for line in result.stdout.lines if line.startswith("test_t.py::")]
    assert result.ret == 0 and ids == expected, result.stdout.str()
