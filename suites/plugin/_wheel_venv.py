"""A fresh venv with only the wheel, as a manager's maintainer has it after ``pip install pytest_kvcm-*.whl``.

The README's recipe for a maintainer (and ``suites/plugin/test_maintainer_recipe.py``, which runs it) must not
lean on this checkout: not on its sources, not on the editable install of the venv running the tests. So:

* the wheel is built from a copy of the files it is made of (``pyproject.toml``, ``README.md``, ``kvcm/``,
  ``pytest_kvcm/``): building in the checkout would leave ``build/`` behind, whose stale modules setuptools
  would put in the next wheel;
* the venv is new (``python -m venv``, no system site-packages), the wheel is installed into it by pip (so its
  ``pytest11`` entry point is what loads the plugin, and its console scripts exist), and pytest is started by
  the venv's own ``pytest`` script;
* the wheel's dependencies are the ones its METADATA declares (``Requires-Dist``, with the extras asked for),
  closed over their own requirements and taken from the venv running the tests: no registry is asked, and
  nothing else is visible (the test venv's other pytest plugins, the editable ``pytest_kvcm``, the checkout).
  They are linked into one folder that a ``.pth`` file puts on the new venv's path, and ``pip check`` then
  proves that the wheel's requirements are met by them alone.
"""

from __future__ import annotations

import email.parser
import importlib.metadata as md
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

WHEEL_SOURCES = ("pyproject.toml", "README.md", "kvcm", "pytest_kvcm")
# what the recipe installs beside the wheel (the README's pip line): the contract's state machines need it
RECIPE_EXTRAS = ("hypothesis>=6",)
# variables that would let the test venv's setup reach into the new one
_LEAKY_ENV = ("PYTHONPATH", "PYTEST_ADDOPTS", "PYTEST_PLUGINS", "PYTEST_DISABLE_PLUGIN_AUTOLOAD", "VIRTUAL_ENV",
              "PYTHONHOME", "KVCM_REFERENCE_DIR")


def build_wheel(root: Path, tmp: Path) -> Path:
    """``pip wheel`` of a copy of the checkout's package files (no build isolation: no registry needed)."""
    src = tmp / "src"
    for name in WHEEL_SOURCES:
        if (root / name).is_dir():
            shutil.copytree(root / name, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        else:
            src.mkdir(parents=True, exist_ok=True)
            shutil.copy2(root / name, src / name)
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                           "-w", str(tmp / "dist"), str(src)], capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        raise AssertionError(f"building the wheel failed:\n{proc.stdout}{proc.stderr}")
    (whl,) = (tmp / "dist").glob("pytest_kvcm-*.whl")
    return whl


def declared_requirements(wheel: Path, extras: tuple[str, ...] = ()) -> list[Requirement]:
    """The wheel's ``Requires-Dist`` lines whose markers hold with the given extras (none: the base ones)."""
    with zipfile.ZipFile(wheel) as zf:
        (meta,) = [n for n in zf.namelist() if n.endswith(".dist-info/METADATA")]
        headers = email.parser.Parser().parsestr(zf.read(meta).decode())
    reqs = [Requirement(line) for line in headers.get_all("Requires-Dist") or []]
    return [r for r in reqs if r.marker is None or any(r.marker.evaluate({"extra": e}) for e in ("", *extras))]


def dependency_closure(reqs: list[Requirement]) -> dict[str, md.Distribution]:
    """Every distribution ``reqs`` need, transitively, as installed in the running interpreter."""
    found: dict[str, md.Distribution] = {}
    seen: set[tuple[str, frozenset]] = set()
    todo = list(reqs)
    while todo:
        req = todo.pop()
        key = (canonicalize_name(req.name), frozenset(req.extras))
        if key in seen:
            continue
        seen.add(key)
        try:
            dist = md.distribution(req.name)
        except md.PackageNotFoundError:
            raise AssertionError(f"{req} (a dependency of the wheel) is not installed in {sys.prefix}") from None
        found[key[0]] = dist
        for line in dist.requires or []:
            sub = Requirement(line)
            if sub.marker is None or any(sub.marker.evaluate({"extra": e}) for e in ("", *req.extras)):
                todo.append(sub)
    return found


def _link_dependencies(dists: dict[str, md.Distribution], into: Path) -> None:
    into.mkdir(parents=True)
    for dist in dists.values():
        base = Path(dist.locate_file(""))
        for top in {f.parts[0] for f in dist.files or [] if f.parts[0] not in ("..", "__pycache__")}:
            if not (into / top).exists() and (base / top).exists():
                (into / top).symlink_to(base / top)


def fresh_venv(path: Path, wheel: Path, extras: tuple[str, ...] = ()) -> Path:
    """A new venv at ``path`` holding the wheel (pip-installed) and its dependencies; returns its bin folder."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True, timeout=120)
    python = path / "bin" / "python"
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True, env=clean_env()).stdout.strip())
    reqs = declared_requirements(wheel, extras) + [Requirement(r) for r in RECIPE_EXTRAS]
    _link_dependencies(dependency_closure(reqs), path / "deps")
    (site / "_wheel_dependencies.pth").write_text(f"{path / 'deps'}\n")
    pip = [sys.executable, "-m", "pip", "--python", str(python)]
    for args in (["install", "--no-deps", "--no-index", "-q", str(wheel)], ["check"]):
        proc = subprocess.run(pip + args, capture_output=True, text=True, timeout=300, env=clean_env())
        if proc.returncode != 0:
            raise AssertionError(f"pip {' '.join(args)} in the fresh venv failed:\n{proc.stdout}{proc.stderr}")
    # pytest's console script, as pip writes it from pytest's entry point (pytest came in as a linked dependency)
    (entry,) = md.distribution("pytest").entry_points.select(group="console_scripts", name="pytest")
    script = path / "bin" / "pytest"
    script.write_text(f"#!{python}\nimport sys\nfrom {entry.module} import {entry.attr}\n"
                      f"if __name__ == '__main__':\n    sys.exit({entry.attr}())\n")
    script.chmod(0o755)
    return path / "bin"


def clean_env(bin_dir: Path | None = None, **extra: str) -> dict[str, str]:
    """The environment a maintainer's shell has: nothing of the test venv's, the fresh venv's bin first."""
    env = {k: v for k, v in os.environ.items() if k not in _LEAKY_ENV}
    if bin_dir is not None:
        env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
        env["VIRTUAL_ENV"] = str(bin_dir.parent)
    env.update(extra)
    return env
