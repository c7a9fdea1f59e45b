"""Green cannot be bought with declarations (issue 55.1-2): docs/contract.md's prefix-caching manager, with one of
six bugs planted, is caught by the contract suites with every declared-difference key and note declared, one at a
time and all at once, except in the cells where the key declares exactly that behaviour (``EXCUSED``).

Before, ``differences["exact_pool_size"]`` skipped 17 whole tests, the four catchers of a matched last prompt
token among them: 14 passed, 55 skipped, exit 0 on the buggy manager.

How a cell is judged: one pytest run holds every cell as a target of its own (the clean manager and each bug,
under each declaration). A failing test catches a bug only where the clean manager under the same declaration
passes that test (a key that does not fit the manager fails a correct one too: that is the key's failure, not a
catch), and only a failed check counts, never an error. A cell stops at its first catch, and the clean manager's
tests stop once every bug under its declaration is caught (undeclared, it runs them all: docs/contract.md says
the example passes every contract test), so the run is seconds, not a contract run a cell.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_kvcm.targets.differences import KEYS, NOTES

pytestmark = pytest.mark.cpu_only
ROOT = Path(__file__).resolve().parents[2]

# the bug -> (what it is, the line of docs/contract.md's example it changes, the line it puts there)
BUGS = {
    "last-token": ("a block-aligned prompt's last token is matched (nano-vllm #144: nothing left to compute)",
                   "return min(matched, (len(ids) - 1) // self.page_size) * self.page_size",
                   "return min(matched, len(ids) // self.page_size) * self.page_size"),
    "leak-at-free": ("a freed request's pages never come back",
                     "for page in reversed(self.tables.pop(rid)):", "for page in reversed(self.tables.pop(rid)[:0]):"),
    "refusal-keeps-a-page": ("a refused allocation keeps a page (TensorRT-LLM PR #17162's leaked dummies)",
                             "        if need > self.free_pages():\n            return False",
                             "        if need > self.free_pages():\n            self._hold(self._take())\n"
                             "            return False"),
    "page-off-by-one": ("a request one token into a page is given no page for it",
                        "need = -(-slots // self.page_size)", "need = slots // self.page_size"),
    "cached-not-free": ("cached pages nobody holds are not counted as free",
                        "return len(self.free_ids) + len(self.idle)", "return len(self.free_ids)"),
    "evicts-held-page": ("a page a running request holds stays evictable (TensorRT-LLM #17926)",
                         "        self.idle.pop(page, None)\n", "\n"),
}
DECLARATIONS = ["none", *KEYS, *NOTES, "all"]
# (declaration, bug) -> why the suites do not catch it there: the key declares exactly that behaviour
EXCUSED = {
    ("free_pages", "cached-not-free"): "free_pages declares that free_pages() is not the count of pages a prompt may "
                                       "take: the reuse tests compare no free counts, and cached pages are only "
                                       "ever counted there",
    ("all", "cached-not-free"): "free_pages is among them",
}

PLUGIN = '''
"""The matrix's cells as targets, and the judge of each failure: loaded with -p, so its run hooks see the tests
of the installed contract package (a conftest's see only its own directory's)."""
import json

import pytest

from pytest_kvcm.targets.differences import KEYS, NOTES

SOURCE = {source!r}
BUGS = {bugs!r}
DECLARATIONS = {declarations!r}


def _manager(bug):
    text = SOURCE
    if bug != "clean":
        _, old, new = BUGS[bug]
        assert text.count(old) == 1, (bug, old)
        text = text.replace(old, new)
    scope = {{}}
    exec(compile(text, f"docs/contract.md ({{bug}})", "exec"), scope)
    return scope["MyCachingTarget"]


def _declared(base, declaration):
    keys = [*KEYS, *NOTES] if declaration == "all" else [] if declaration == "none" else [declaration]
    return {{**base, **{{k: "declared in the matrix" for k in keys}}}}


CELLS = {{}}
for declaration in DECLARATIONS:
    for bug in ["clean", *BUGS]:
        cls = _manager(bug)
        name = f"{{bug}}.{{declaration}}"
        CELLS[name] = type(cls.__name__, (cls,), {{"name": name,
                                                  "differences": _declared(cls.differences, declaration)}})


def pytest_kvcm_register_targets(registry):
    registry.update(CELLS)


CLEAN, CAUGHT = {{}}, {{}}     # (declaration, test) -> passed?, cell -> the first test that caught it


def _cell(item):
    name = getattr(getattr(item, "callspec", None), "params", {{}}).get("kvcm_target_name")
    if name is None:
        return None, None, None, None     # a test of kvcm's own rule, no target: not the matrix's
    bug, _, declaration = name.partition(".")
    test = (item.module.__name__, item.originalname,
            tuple(sorted((k, repr(v)) for k, v in item.callspec.params.items() if k != "kvcm_target_name")))
    return name, bug, declaration, test


def pytest_runtest_setup(item):
    name, bug, declaration, _ = _cell(item)
    if name is None:
        pytest.skip("no target")
    if bug != "clean" and name in CAUGHT:
        pytest.skip("caught already")
    if bug == "clean" and declaration != "none" and all(f"{{b}}.{{declaration}}" in CAUGHT for b in BUGS):
        pytest.skip("every bug under this declaration is caught")


def pytest_runtest_makereport(item, call):
    if call.when != "call":
        return
    name, bug, declaration, test = _cell(item)
    if name is None:
        return
    failed = call.excinfo is not None and not call.excinfo.errisinstance(pytest.skip.Exception)
    if bug == "clean":
        CLEAN[(declaration, test)] = not failed
    elif failed and CLEAN.get((declaration, test)) and name not in CAUGHT:
        CAUGHT[name] = f"{{test[0].rpartition('.')[2]}}::{{test[1]}}"


def pytest_sessionfinish(session):
    with open("matrix.json", "w") as f:
        json.dump(CAUGHT, f)
'''


def example_manager() -> str:
    """docs/contract.md's prefix-caching manager and its adapter, as the page shows it."""
    text = (ROOT / "docs" / "contract.md").read_text()
    start = text.index("from collections import OrderedDict")
    return text[start:text.index("```", start)]


def _contract_modules() -> list[str]:
    """The shipped contract modules whose tests take a target (``test_target_apis`` drives engines' own APIs)."""
    import pytest_kvcm.contract

    here = Path(pytest_kvcm.contract.__file__).parent
    return sorted(f"pytest_kvcm.contract.{p.stem}" for p in here.glob("test_target_*.py")
                  if p.stem != "test_target_apis")


def test_no_declaration_buys_green(pytester):
    pytester.makepyfile(matrix_cells=PLUGIN.format(source=example_manager(), bugs=BUGS, declarations=DECLARATIONS))
    cells = [f"{bug}.{d}" for d in DECLARATIONS for bug in ["clean", *BUGS]]
    result = pytester.runpytest_subprocess("-p", "matrix_cells", f"--kvcm-target={','.join(cells)}", "-p",
                                           "no:randomly", "-q", "--pyargs", *_contract_modules())
    caught = json.loads((pytester.path / "matrix.json").read_text())
    rows = []
    for d in DECLARATIONS:
        for bug in BUGS:
            cell = f"{bug}.{d}"
            excused = EXCUSED.get((d, bug))
            if (cell in caught) == (excused is None):
                continue
            rows.append(f"{d} x {bug}: " + (f"caught by {caught[cell]}, but EXCUSED says {excused!r}" if excused
                                              else f"NOT CAUGHT ({BUGS[bug][0]})"))
    assert not rows, "\n".join(rows) + "\n\n" + result.stdout.str()[-4000:]
    # docs/contract.md's claim: the example, nothing declared but sliding_window, passes every contract test (the
    # clean manager undeclared is the one cell that runs them all)
    clean = [line for line in result.stdout.lines if "[clean.none" in line and ("FAILED" in line or "ERROR" in line)]
    assert not clean, clean
