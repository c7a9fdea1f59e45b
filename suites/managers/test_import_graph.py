"""kvcm's modules import one another without a cycle, counting imports inside functions too.

An import inside a function that closes a cycle (``model_spec`` -> ``parallel`` -> ``seams`` -> ``constraints`` ->
``layer_groups`` -> ``model_spec``, as it was) works until someone moves it to the top of its module, and says that
two modules are one concept cut in two. The graph is read from the source (``ast``): an edge for every
``import`` / ``from ... import`` of a kvcm module, at any depth; a submodule's import of its own package (which
Python imports first anyway) is no edge.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = "kvcm"
# the sizing core: once closed by imports inside functions, now none among them at all
SIZING_CORE = ("constraints", "layer_groups", "model_spec", "parallel", "storage_quota", "attention_types")


def modules(root: Path = ROOT, package: str = PACKAGE) -> dict[str, tuple[Path, bool]]:
    """Dotted name -> (file, is a package) of every module of ``package``."""
    out = {}
    for path in (root / package).rglob("*.py"):
        parts = list(path.relative_to(root).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        out[".".join(parts[:-1] if is_package else parts)] = (path, is_package)
    return out


def _imported(node, name: str, is_package: bool) -> list[str]:
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    base = name.split(".") if is_package else name.split(".")[:-1]
    if node.level > 1:
        base = base[:-(node.level - 1)]
    target = ".".join(base + [node.module] if node.module else base) if node.level else node.module
    return [target] + [f"{target}.{a.name}" for a in node.names]


def import_edges(source: str, name: str, is_package: bool, known, *, in_functions_only: bool = False) -> set[str]:
    """The kvcm modules ``source`` (module ``name``) imports; an ``from X import Y`` where Y is a module is an
    edge to Y alone."""
    tree = ast.parse(source)
    nested = set()
    for fn in ast.walk(tree):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            nested.update(id(n) for n in ast.walk(fn) if isinstance(n, (ast.Import, ast.ImportFrom)))
    out = set()
    for node in ast.walk(tree):
        if not isinstance(node, (ast.Import, ast.ImportFrom)) or (in_functions_only and id(node) not in nested):
            continue
        targets = [t for t in _imported(node, name, is_package) if t in known]
        submodules = [t for t in targets[1:] if isinstance(node, ast.ImportFrom)]
        for t in submodules or targets:
            if t != name and not f"{name}.".startswith(f"{t}."):
                out.add(t)
    return out


def graph(root: Path = ROOT, package: str = PACKAGE, **kw) -> dict[str, set[str]]:
    known = modules(root, package)
    return {name: import_edges(path.read_text(), name, is_package, known, **kw)
            for name, (path, is_package) in known.items()}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in list(edges):
        if v not in index:
            visit(v)
    return out


def test_kvcm_has_no_import_cycle():
    assert cycles(graph()) == []


def test_the_sizing_core_imports_nothing_inside_functions():
    inner = graph(in_functions_only=True)
    assert {m: sorted(inner[f"{PACKAGE}.{m}"]) for m in SIZING_CORE if inner[f"{PACKAGE}.{m}"]} == {}


def test_the_scan_finds_a_cycle_closed_inside_a_function(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from . import b\n")
    (pkg / "b.py").write_text("def f():\n    from .c import g\n    return g\n")
    (pkg / "c.py").write_text("from .a import x\nfrom pkg import d\n")
    (pkg / "d.py").write_text("import pkg\n")
    assert cycles(graph(tmp_path, "pkg")) == [["pkg.a", "pkg.b", "pkg.c"]]
    assert graph(tmp_path, "pkg", in_functions_only=True)["pkg.b"] == {"pkg.c"}
