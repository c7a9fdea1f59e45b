"""--kvcm-version parametrization, narrowing and deselection, seen from a user's project (pytester)."""

import pytest

pytestmark = pytest.mark.cpu_only

TESTS = """
import pytest

def test_any(kvcm_version):
    assert kvcm_version in ("v1", "v2")  # auto arrives resolved

def test_factory(kvcm_manager_factory):
    import kvcm
    m = kvcm_manager_factory(kvcm.ModelSpec.uniform(2, 2, 8), kvcm.KvCacheConfig(max_tokens=64),
                             max_batch_size=2, max_seq_len=64)
    assert m.kvcm_version == kvcm_manager_factory.kvcm_version

@pytest.mark.kvcm_versions("v2")
def test_v2_only(kvcm_version):
    assert kvcm_version == "v2"

def test_plain():
    pass
"""


def collected(pytester, *args):
    pytester.makepyfile(test_user=TESTS)
    result = pytester.runpytest_inprocess("--collect-only", "-q", *args)
    return [line for line in result.outlines if "::" in line], result


def test_both_gives_v1_and_v2_ids(pytester):
    ids, _ = collected(pytester, "--kvcm-version=both")
    assert "test_user.py::test_any[v1]" in ids and "test_user.py::test_any[v2]" in ids
    assert "test_user.py::test_factory[v1]" in ids and "test_user.py::test_factory[v2]" in ids
    assert "test_user.py::test_v2_only[v2]" in ids and "test_user.py::test_v2_only[v1]" not in ids
    assert "test_user.py::test_plain" in ids


def test_v2_only_gives_v2_ids(pytester):
    ids, _ = collected(pytester, "--kvcm-version=v2")
    assert all("[v1]" not in i for i in ids)
    assert "test_user.py::test_any[v2]" in ids


def test_excluded_version_is_deselected_with_reason(pytester):
    pytester.makepyfile(test_user=TESTS)
    result = pytester.runpytest_inprocess("--kvcm-version=v1", "-rA")
    result.assert_outcomes(passed=3, deselected=1)
    result.stdout.fnmatch_lines(["*deselected 1 test(s) need a kvcm version this run (v1) excludes*",
                                 "*test_user.py::test_v2_only runs only on v2"])


def test_ini_default_and_k_selection(pytester):
    pytester.makeini("[pytest]\nkvcm_version = both\n")
    pytester.makepyfile(test_user=TESTS)
    result = pytester.runpytest_inprocess("-k", "v2")
    result.assert_outcomes(passed=3)


def test_auto_runs_once(pytester):
    ids, _ = collected(pytester)
    assert "test_user.py::test_any[auto]" in ids
    pytester.runpytest_inprocess().stdout.fnmatch_lines(["kvcm versions: auto"])


def test_auto_reaches_tests_resolved_and_the_factory_follows_the_model(pytester):
    """Under ``auto`` no test sees the string 'auto': the fixture gives kvcm's choice for a model without a
    preference, and the factory gives each model the version it declares."""
    pytester.makepyfile(test_auto="""
        import dataclasses
        import kvcm

        def test_resolved(kvcm_version, kvcm_manager_factory):
            assert kvcm_version == "v1"
            plain = kvcm.ModelSpec.uniform(2, 2, 8)
            prefers_v2 = dataclasses.replace(plain, preferred_manager="v2")
            limits = kvcm.Limits(max_batch_size=2, max_seq_len=64)
            cfg = kvcm.KvCacheConfig(max_tokens=64)
            assert kvcm_manager_factory(plain, cfg, limits).kvcm_version == "v1"
            assert kvcm_manager_factory(prefers_v2, cfg, limits).kvcm_version == "v2"
    """)
    pytester.runpytest_inprocess("--kvcm-version=auto").assert_outcomes(passed=1)


def test_bad_version_is_a_usage_error(pytester):
    pytester.makepyfile(test_user=TESTS)
    result = pytester.runpytest_inprocess("--kvcm-version=v3")
    assert result.ret != 0
    result.stderr.fnmatch_lines(["*invalid choice: 'v3'*"])


@pytest.mark.post_merge
def test_xdist_workers_see_the_same_parametrization(pytester):
    pytest.importorskip("xdist")
    pytester.makepyfile(test_user=TESTS)
    result = pytester.runpytest_subprocess("-n", "2", "--kvcm-version=both")
    result.assert_outcomes(passed=6)


def test_a_test_that_parametrizes_kvcm_version_keeps_its_own_list(pytester):
    """A comparison that needs V1 and V2 whatever the run writes ``parametrize("kvcm_version", ...)``: the
    plugin leaves it alone (no duplicate parametrization, no narrowing by --kvcm-version)."""
    pytester.makepyfile(test_pinned="""
        import pytest

        @pytest.mark.parametrize("kvcm_version", ["v1", "v2"])
        def test_pinned(kvcm_version, kvcm_manager_factory):
            assert kvcm_manager_factory.kvcm_version == kvcm_version

        @pytest.mark.parametrize("kind, kvcm_version", [("a", "v2")])
        def test_pinned_pair(kind, kvcm_version):
            assert kvcm_version == "v2"
    """)
    result = pytester.runpytest_inprocess("--kvcm-version=v1", "-v")
    result.assert_outcomes(passed=3)
    result.stdout.fnmatch_lines(["*test_pinned[[]v1[]] PASSED*", "*test_pinned[[]v2[]] PASSED*"])


def test_factory_version_attribute_is_a_deprecated_spelling():
    from pytest_kvcm.versions import ManagerFactory

    with pytest.warns(DeprecationWarning, match=r"ManagerFactory: \.version is deprecated; use \.kvcm_version"):
        assert ManagerFactory("v2").version == "v2"
