"""``kvcm sensitivity`` names a catching test by its module (issue 42.5): with the venv inside the project it
printed ``.venv.lib.python3.11.site-packages.pytest_kvcm.contract...`` and "caught by 3 test(s) in ;", and for
suites run with ``--pyargs`` from outside the rootdir ids with no module at all (``::test_x[mine]``)."""

import pytest

from pytest_kvcm.junit_outcomes import failed_tests
from pytest_kvcm.sensitivity import _levels

pytestmark = pytest.mark.cpu_only

FAILING = "import pytest\n\n@pytest.mark.parametrize('p', ['mine'])\ndef test_fails(p):\n    assert p == 'yours'\n"


def _installed(pytester, where: str) -> None:
    pkg = pytester.path / where / "mypkg"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "test_x.py").write_text(FAILING)
    pytester.syspathinsert(pkg.parent)


@pytest.mark.parametrize("where, rootdir", [(".venv/lib/python3.11/site-packages", "."), ("elsewhere", "proj")],
                         ids=["venv_inside_the_project", "package_outside_the_rootdir"])
def test_catchers_are_named_by_module(pytester, where, rootdir):
    _installed(pytester, where)
    (pytester.path / "proj").mkdir()
    pytester.runpytest_inprocess("-p", "pytest_kvcm.sensitivity", "-p", "no:randomly", f"--rootdir={rootdir}",
                                 "--junitxml=r.xml", "--pyargs", "mypkg.test_x")
    total, failed = failed_tests(pytester.path / "r.xml")
    assert (total, failed) == (1, ["mypkg.test_x::test_fails[mine]"])
    assert _levels(failed) == ["mypkg.test_x"]


def test_levels_of_the_project_s_own_suites():
    assert _levels(["pytest_kvcm.contract.test_target_lifecycle::test_a[mine]",
                    "suites.managers.test_budget::test_b", "conftest_less::test_c", "::test_d"]) == \
        ["?", "conftest_less", "contract", "managers"]
