"""A user's adapter is checked when the session starts (issue 27.2): a missing required method, a wrong return type
or a page size that is not a positive int is one usage error naming the target, the adapter and the method, and
no test runs; the README's adapter and kvcm's own pass the same check."""

import pytest

from pytest_kvcm.targets import BUILTIN_TARGETS, KVCacheTarget
from pytest_kvcm.targets.adapter_check import PROBE, check_registered

from test_targets import readme_adapter

pytestmark = pytest.mark.cpu_only


def _readme_target():
    namespace = {}
    exec(compile(readme_adapter(), "README.md", "exec"), namespace)
    return namespace["MyTarget"]


def _usage_error(factory) -> str:
    with pytest.raises(pytest.UsageError) as info:
        check_registered({"mine": factory}, ["mine"], BUILTIN_TARGETS)
    return str(info.value)


@pytest.mark.parametrize("name", ["kvcm-v1", "kvcm-v2", "kvcm-v4", "trtllm"])
def test_builtin_adapters_pass_the_check(name):
    check_registered({name: BUILTIN_TARGETS[name]}, [name], {})  # probed as if a user had registered them


def test_readme_adapter_passes_and_is_left_empty():
    made = []

    def factory(spec):
        made.append(_readme_target()(spec))
        return made[-1]

    check_registered({"mine": factory}, ["mine"], BUILTIN_TARGETS)
    (target,) = made
    assert target.requests == [] and target.free_pages() == PROBE.num_pages


def test_missing_required_method_names_it():
    MyTarget = _readme_target()
    del MyTarget.held_pages
    msg = _usage_error(MyTarget)
    assert msg.startswith("--kvcm-target=mine: adapter MyTarget, held_pages: held_pages not implemented"), msg


def test_allocate_returning_none_is_a_wrong_return_type():
    class Forgetful(_readme_target()):
        def _allocate(self, rid, n, lookahead):
            self._reserve(rid, n + lookahead)  # forgot the return

    msg = _usage_error(Forgetful)
    assert "adapter Forgetful, _allocate: _allocate must return a bool" in msg and "returned None" in msg, msg


def test_held_pages_must_be_a_dict_of_pages():
    class Counting(_readme_target()):
        def held_pages(self, rid):
            return len(self.tables[rid])

    assert 'adapter Counting, held_pages: held_pages must return a dict with an int "full" entry' in _usage_error(Counting)


@pytest.mark.parametrize("page_size", [0, -16, 16.0, "16", None, True])
def test_page_size_must_be_a_positive_int(page_size):
    class Odd(_readme_target()):
        def __init__(self, spec):
            super().__init__(spec)
            self.page_size = page_size

    msg = _usage_error(Odd)
    assert f"adapter Odd, page_size: page_size must be an int >= 1; it is {page_size!r}" in msg, msg


def test_a_half_capacity_query_names_the_missing_half():
    class Half(_readme_target()):
        def available_tokens(self, bound, batch_size=1, lookahead=0):
            return bound

    assert "adapter Half, allocate_generation: available_tokens is defined but allocate_generation" in _usage_error(Half)


def test_factory_must_return_a_target():
    msg = _usage_error(lambda spec: object())
    assert "adapter test_adapter_check.test_factory_must_return_a_target.<locals>.<lambda>, factory: the factory must " \
           "return a pytest_kvcm.targets.KVCacheTarget; it returned object" in msg, msg


def test_broken_adapter_stops_the_session_before_any_test(pytester):
    pytester.makeconftest(readme_adapter().replace("return {\"full\": len(self.tables[rid])}", "pass"))
    pytester.makepyfile("def test_never_runs(kvcm_target):\n    raise AssertionError('ran')\n")
    result = pytester.runpytest_subprocess("--kvcm-target=mine", "-p", "no:randomly")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(['ERROR: --kvcm-target=mine: adapter MyTarget, held_pages: held_pages must return a '
                                 'dict with an int "full" entry; it returned None (NoneType)'])
    assert "ran" not in result.stdout.str() and "Traceback" not in result.stderr.str()


def test_base_class_is_not_an_adapter():
    assert "not implemented" in _usage_error(KVCacheTarget)
