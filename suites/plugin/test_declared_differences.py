"""Declared differences relax only what they name (issue 42.1): declaring every key at once cannot skip the
refused-allocation checks, the run ends with the list of what was relaxed, and an unknown key is one usage error.

A maintainer's correct design once failed ``test_repeated_block_aligned_prompt``; declaring ``last_prompt_block``
made it green and also skipped ``test_failed_allocation_with_a_hit_changes_nothing``, so a manager whose refused
allocations leaked would have passed. Here the leak is planted in kvcm V1 (whose reuse really has the
``last_prompt_block`` design) behind an adapter that declares every key.
"""

import pytest

from pytest_kvcm.contract.__main__ import keys_table
from pytest_kvcm.targets.differences import KEYS, NOTES

pytestmark = pytest.mark.cpu_only

REFUSALS = ("pytest_kvcm.contract.test_target_lifecycle", "pytest_kvcm.contract.test_target_reuse")
PICK = "refused_allocation_and_growth or failed_allocation_with_a_hit"

ADAPTER = """
from pytest_kvcm.targets.differences import KEYS, NOTES
from pytest_kvcm.targets.kvcm_targets import KvcmV1Target


class Declares(KvcmV1Target):
    name = "mine"
    differences = {key: "declared" for key in [*KEYS, *NOTES]}
    LEAK = LEAK_VALUE

    def _allocate(self, rid, num_tokens, lookahead):
        ok = super()._allocate(rid, num_tokens, lookahead)
        if not ok and self.LEAK:
            super()._allocate(rid + "-leak", 1, 0)   # the bug: a refusal keeps a page
        return ok

    def _allocate_prompt(self, rid, token_ids):
        got = super()._allocate_prompt(rid, token_ids)
        if got is None and self.LEAK:
            super()._allocate(rid + "-leak", 1, 0)
        return got


def pytest_kvcm_register_targets(registry):
    registry["mine"] = Declares
"""


def _run(pytester, leak: bool, *extra):
    pytester.makeconftest(ADAPTER.replace("LEAK_VALUE", str(leak)))
    return pytester.runpytest_subprocess("--kvcm-target=mine", "-p", "no:randomly", "-k", PICK,
                                         "--pyargs", *REFUSALS, *extra)


def test_every_key_declared_still_runs_the_refusal_checks_and_they_catch_a_leak(pytester):
    leaky = _run(pytester, True)
    leaky.assert_outcomes(failed=2)
    out = leaky.stdout.str()
    assert "a refused allocation changed the pool" in out and "the refused allocation changed the pool" in out, out

    clean = _run(pytester, False)   # the same declarations without the leak: green, and it says what it relaxed
    clean.assert_outcomes(passed=2)
    clean.stdout.fnmatch_lines([
        "*kvcm declared differences: 2 test(s) relaxed and passed, 0 relaxed and failed, 0 skipped*",
        "relaxed and passed: *",
        "  mine differs on exact_pool_size: the refused growth asks for max_model_len tokens*(1 test(s))",
        "      pytest_kvcm.contract.test_target_lifecycle::test_refused_allocation_and_growth_change_nothing[[]mine[]]",
        "  mine differs on last_prompt_block: req 1 hits 2 blocks*",
        "  mine differs on free_pages: vLLM's case at the boundary*is not run*",
    ])


def test_an_unknown_key_is_one_usage_error_naming_the_keys(pytester):
    pytester.makeconftest(ADAPTER.replace("LEAK_VALUE", "False").replace(
        'differences = {key: "declared" for key in [*KEYS, *NOTES]}', 'differences = {"duplicate_block": "typo"}'))
    result = pytester.runpytest_subprocess("--kvcm-target=mine", "--pyargs", REFUSALS[0])
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    err = result.stderr.str()
    assert "adapter Declares, differences: unknown key 'duplicate_block'" in err and "duplicate_blocks" in err, err
    assert "Traceback" not in err


def test_every_key_read_by_a_contract_test_is_documented():
    """Each key the suites read is in KEYS, and KEYS and NOTES are in the docstring and docs/contract.md."""
    import re
    from pathlib import Path

    import pytest_kvcm.contract
    from pytest_kvcm.targets.contract import KVCacheTarget

    root = Path(pytest_kvcm.contract.__file__).parent
    read = set()
    for path in [*root.glob("test_*.py"), *(root.parent / "targets").glob("*.py")]:
        read |= set(re.findall(r"""\.(?:differs|require)\(\s*["'](\w+)["']""", path.read_text()))
    assert read and read <= set(KEYS), sorted(read - set(KEYS))
    doc = (Path(__file__).resolve().parents[2] / "docs" / "contract.md").read_text()
    for key in [*KEYS, *NOTES]:
        assert f"``{key}``" in KVCacheTarget.__doc__, key
    assert keys_table() in doc, "docs/contract.md's key table is not python -m pytest_kvcm.contract --keys"


def test_the_key_table_ships_with_the_package():
    """The wheel ships no docs (issue 55.7): the table is printed from the installed package."""
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "pytest_kvcm.contract", "--keys"], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0 and proc.stdout.strip() == keys_table().strip(), proc.stderr
    assert all(f"| `{key}` |" in proc.stdout for key in KEYS) and all(f"`{n}`" in proc.stdout for n in NOTES)


PRIVATE = '''
from pytest_kvcm.targets.kvcm_targets import KvcmV2Target


class Private(KvcmV2Target):
    """kvcm V2 with the page swap off: a block recomputed under the last-token rule stays the request's own page
    and is freed at release (the design of the report behind issue 42.1)."""
    name = "private"
    differences = DECLARED

    def _build(self, spec):
        manager = super()._build(spec)
        manager._reuse_rules = type("NoRebase", (type(manager._reuse_rules),), {"rebase": False})()
        return manager


def pytest_kvcm_register_targets(registry):
    registry["private"] = Private
'''


def test_a_private_recomputed_block_is_a_design_with_its_own_key(pytester):
    """Undeclared, only test_repeated_block_aligned_prompt fails, naming the keys; declared, every reuse test
    passes, the refusal and last-block checks included (the key that fitted before skipped them)."""
    pytester.makeconftest(PRIVATE.replace("DECLARED", "{}"))
    args = ("-p", "no:randomly", "--kvcm-target=private", "--pyargs", "pytest_kvcm.contract.test_target_reuse")
    undeclared = pytester.runpytest_subprocess(*args)
    undeclared.assert_outcomes(failed=1, passed=15)
    undeclared.stdout.fnmatch_lines(["*test_repeated_block_aligned_prompt[[]private[]]*",
                                     "*4 for a design that declares duplicate_blocks, private_recomputed_block*"])
    pytester.makeconftest(PRIVATE.replace("DECLARED", "{'private_recomputed_block': 'kept private, freed at release'}"))
    declared = pytester.runpytest_subprocess(*args, "-v")
    declared.assert_outcomes(passed=16)
    declared.stdout.fnmatch_lines(["*test_failed_allocation_with_a_hit_changes_nothing[[]private[]] PASSED*",
                                   "*test_block_aligned_prompt_stores_its_last_block[[]private[]] PASSED*",
                                   "  private differs on private_recomputed_block: 4 pages held while both run*"])
