"""The suites' layout: test modules are imported by basename (rootdir ``conftest.py``, no packages), so two
``test_x.py`` in different suites stop collection of the whole tree with an import-file mismatch."""

from collections import defaultdict
from pathlib import Path

SUITES = Path(__file__).resolve().parent.parent


def test_no_two_test_modules_share_a_basename():
    where = defaultdict(list)
    for path in sorted(SUITES.rglob("test_*.py")):
        where[path.name].append(str(path.relative_to(SUITES)))
    shared = {name: paths for name, paths in where.items() if len(paths) > 1}
    assert not shared, f"rename one of each: {shared}"
