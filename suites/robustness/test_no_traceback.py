"""Inputs that ended in a traceback now end in one line naming the input and what is accepted.

Before: the dashboard raised ``OverflowError`` on a row whose time is 1e20, ``AttributeError`` on an
``extra.spec`` that is a list and ``ValueError`` on a ``min_samples`` string; ``ResultsStore.query(limit='ten')``
and a corrupt store raised from ``sqlite3``, ``query(passed='no')`` matched ``passed = 1``; ``--kvcm-results``
under ``/proc`` or through a symlink loop passed the start-up check and failed at the first record;
``load_spec(None)`` / ``(42)`` raised ``TypeError`` and a deeply nested config ``RecursionError``;
``block_tables(None)`` a ``TypeError``; a corrupt ``KVCM_GEMMA3_GGUF`` a trace from inside transformers;
``create_kv_cache_manager(mapping={'tp_size': 2})`` an ``AttributeError``; the benchmarks' GSM8K loader a
``KeyError`` or ``JSONDecodeError``.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

import kvcm
from kvcm.config import KvCacheConfig
from kvcm.model_spec import ModelSpec
from pytest_kvcm.dashboard import main as dashboard
from pytest_kvcm.results import ResultsStore, StoreError

from _robustness import shared_tmp, unprivileged_prefix

ROOT = Path(__file__).resolve().parents[2]


def _store(path: Path, **extra) -> Path:
    with ResultsStore(path, run_id="r1") as store:
        store.record("accuracy.gsm8k", 71.5, test_id="t::a", model="m", kvcm_version="v1", threshold=70.0, n=10,
                     **extra)
        store.record("accuracy.gsm8k", 72.5, test_id="t::a", model="m", kvcm_version="v2", threshold=70.0, n=10)
    return path


def _edit(path: Path, sql: str, *args) -> Path:
    con = sqlite3.connect(path)
    con.execute(sql, args)
    con.commit()
    con.close()
    return path


# ----------------------------------------------------------------------------------------------- dashboard rows
def test_dashboard_skips_a_row_from_the_far_future(tmp_path, capsys):
    store = _edit(_store(tmp_path / "s.db"), "UPDATE results SET time = 1e20 WHERE id = 1")
    assert dashboard(["--results", str(store), "--out", str(tmp_path / "d.html")]) == 0
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and "1 row(s) skipped" in out and "time=1e+20 must be seconds since the epoch in " \
        "[0, 253402300799] (1970-9999)" in out
    assert "72.5" in (tmp_path / "d.html").read_text()  # the good row is drawn


@pytest.mark.parametrize("extra, shown", [
    ({"spec": ["a", "b"]}, "[&quot;a&quot;, &quot;b&quot;]"),
    ({"spec": "plain"}, "plain"),
    ({"verdict": "cannot decide", "min_samples": "many"}, "fails from n=many"),
    ({"verdict": "cannot decide", "min_samples": 1200}, "fails from n=1,200"),
], ids=["spec_a_list", "spec_a_string", "min_samples_a_string", "min_samples_a_count"])
def test_dashboard_draws_extra_fields_of_any_shape(tmp_path, capsys, extra, shown):
    store = _store(tmp_path / "s.db", extra=extra)
    assert dashboard(["--results", str(store), "--out", str(tmp_path / "d.html")]) == 0
    assert shown in (tmp_path / "d.html").read_text()


@pytest.mark.parametrize("value", [1e308, -1e308, 1e-300])
def test_dashboard_chart_has_only_finite_coordinates(tmp_path, value):
    """Scores whose difference overflows (1e308 and -1e308) once drew ``nan`` coordinates."""
    from pytest_kvcm.dashboard_chart import history_svg

    points = [{"time": 1.7e9 + i, "value": v, "threshold": -v, "kvcm_version": "v1", "n": 1, "passed": True,
               "git_commit": None} for i, v in enumerate((value, -value, 0.0))]
    svg = history_svg(points)
    assert "nan" not in svg and "inf" not in svg and svg.count("<circle") == 3


# ----------------------------------------------------------------------------------------------- store API
@pytest.mark.parametrize("kwargs, fragment", [
    ({"limit": "ten"}, "query(limit='ten'): must be an integer >= 0 or None"),
    ({"limit": -1}, "query(limit=-1): must be an integer >= 0 or None"),
    ({"passed": "no"}, "query(passed='no'): must be True, False or None"),
    ({"metric": 5}, "query(metric=5): must be a string or None"),
], ids=["limit_text", "limit_negative", "passed_text", "metric_int"])
def test_query_names_a_bad_argument(tmp_path, kwargs, fragment):
    with ResultsStore(_store(tmp_path / "s.db")) as store:
        with pytest.raises(StoreError) as exc:
            store.query(**kwargs)
        assert str(exc.value) == fragment


@pytest.mark.parametrize("content, fragment", [
    (b"garbage", "exists but is not an SQLite database"),
    (b"SQLite format 3\x00" + b"x" * 300, "is not a readable SQLite database"),
], ids=["garbage", "header_then_garbage"])
def test_opening_a_corrupt_store_is_one_line(tmp_path, content, fragment):
    (tmp_path / "s.db").write_bytes(content)
    with pytest.raises(StoreError) as exc:
        ResultsStore(tmp_path / "s.db")
    assert str(exc.value).startswith(f"results store {tmp_path / 's.db'}: {fragment}")
    assert (tmp_path / "s.db").read_bytes() == content


def test_opening_a_read_only_store_is_one_line():
    prefix = unprivileged_prefix()
    d = Path(shared_tmp("kvcm-ro-"))
    _store(d / "s.db").chmod(0o444)
    code = ("from pytest_kvcm.results import ResultsStore, StoreError\n"
            f"try:\n    ResultsStore({str(d / 's.db')!r})\nexcept StoreError as e:\n    print(e)\n")
    env = {**os.environ, "PYTHONPATH": f"{ROOT}:{os.environ.get('PYTHONPATH', '')}", "HOME": str(d)}
    proc = subprocess.run([*prefix, sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert proc.stdout == f"results store {d / 's.db'}: cannot be opened for writing (Permission denied)\n", \
        proc.stderr


def test_release_matrix_refuses_a_cache_it_cannot_write():
    prefix = unprivileged_prefix()
    d = Path(shared_tmp("kvcm-cache-"))
    (d / "locked").mkdir()
    (d / "locked").chmod(0o555)
    env = {**os.environ, "PYTHONPATH": f"{ROOT}:{os.environ.get('PYTHONPATH', '')}", "HOME": str(d),
           "KVCM_CACHE": str(d / "locked")}
    proc = subprocess.run([*prefix, sys.executable, "-m", "pytest_kvcm.release_matrix", "0.32.0"], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert f"KVCM_CACHE={d / 'locked'}: {d / 'locked' / 'matrix'} cannot be written (Permission denied)" in proc.stderr


@pytest.mark.parametrize("where", ["proc", "symlink_loop", "dangling_symlink"])
def test_results_option_refuses_a_path_it_cannot_create(pytester, where):
    pytester.makepyfile("def test_ok():\n    pass\n")
    if where == "proc":
        path, fragment = Path("/proc/kvcm-results.sqlite"), "cannot be created (/proc cannot hold a new file"
    elif where == "symlink_loop":
        path = pytester.path / "loop.db"
        path.symlink_to(path)
        fragment = "cannot be used (Too many levels of symbolic links)"
    else:
        path = pytester.path / "dangling.db"
        path.symlink_to(pytester.path / "nowhere" / "x.db")
        fragment = "is a symbolic link to a missing file"
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "-p", "no:randomly", f"--kvcm-results={path}")
    text = result.stdout.str() + result.stderr.str()
    assert result.ret == pytest.ExitCode.USAGE_ERROR, text
    assert f"--kvcm-results={path}: {fragment}" in text and "Traceback" not in text and "passed" not in text


# ----------------------------------------------------------------------------------------------- library
@pytest.mark.parametrize("name", [None, 42, "", 3.5], ids=["none", "int", "empty", "float"])
def test_load_spec_names_what_it_takes(name):
    with pytest.raises(kvcm.ConfigError) as exc:
        kvcm.load_spec(name)
    assert "must be an embedded config's name or a config.json path (deepseek-v4-flash, " in str(exc.value)


def test_load_spec_refuses_a_config_nested_too_deeply(tmp_path):
    path = tmp_path / "deep.json"
    path.write_text("[" * 50_000 + "]" * 50_000)
    with pytest.raises(kvcm.ConfigError) as exc:
        kvcm.load_spec(str(path))
    assert f"nests its JSON deeper than a config does ({path}" in str(exc.value)


@pytest.mark.parametrize("kvcm_version", ["v1", "v2"])
def test_block_tables_of_none(kvcm_version):
    mgr = kvcm.create_kv_cache_manager(kvcm_version, ModelSpec.uniform(2, 1, 16), KvCacheConfig(max_tokens=2048),
                                       max_batch_size=4, max_seq_len=256, device="meta")
    with pytest.raises(kvcm.ConfigError) as exc:
        mgr.block_tables(None)
    assert str(exc.value) == "request_ids=None is invalid: must be a list of held request ids"


@pytest.mark.parametrize("mapping", [{"tp_size": 2}, 2, "tp=2"], ids=["dict", "int", "str"])
def test_manager_mapping_that_is_not_a_mapping(mapping):
    with pytest.raises(kvcm.ConfigError) as exc:
        kvcm.create_kv_cache_manager("v2", ModelSpec.uniform(2, 2, 16), KvCacheConfig(max_tokens=2048),
                                     max_batch_size=4, max_seq_len=256, device="meta", mapping=mapping)
    assert f"must be a kvcm.Mapping, not {type(mapping).__name__} (for a dict of its fields" in str(exc.value)


@pytest.mark.parametrize("content, fragment", [
    (b"garbage", "is not a GGUF file (it starts with b'garb', not b'GGUF')"),
    (b"", "is not a GGUF file (it starts with b'', not b'GGUF')"),
    (b"GGUF\x03\x00\x00\x00truncated", "cannot be read as gemma-3-270m's GGUF"),
], ids=["garbage", "empty", "truncated_after_the_magic"])
def test_corrupt_gemma3_gguf_is_one_line(tmp_path, monkeypatch, content, fragment):
    from kvcm.models.gemma3 import gemma3_cache_dir
    from kvcm.models.gguf_cache import ModelNotInstalled

    gguf = tmp_path / "gemma.gguf"
    gguf.write_bytes(content)
    monkeypatch.setenv("KVCM_GEMMA3_GGUF", str(gguf))
    monkeypatch.setenv("KVCM_CACHE_DIR", str(tmp_path / "cache"))
    with pytest.raises(ModelNotInstalled) as exc:
        gemma3_cache_dir()
    assert fragment in str(exc.value) and "\n" not in str(exc.value)
    assert not [p for p in (tmp_path / "cache").glob("*")] if (tmp_path / "cache").exists() else True


# ----------------------------------------------------------------------------------------------- benchmarks
def _gsm8k_dir(tmp_path: Path, test: str) -> Path:
    d = tmp_path / "gsm8k"
    d.mkdir()
    (d / "test.jsonl").write_text(test)
    (d / "train.jsonl").write_text(json.dumps({"question": "1+1?", "answer": "#### 2"}) + "\n")
    return d


@pytest.mark.parametrize("test, fragment", [
    ('{"question": "1+1?"}\n', "test.jsonl:1: a row needs string 'question' and 'answer' fields"),
    ('{"question": "1+1?", "answer": "#### 2"}\n{broken\n', "test.jsonl:2: not a JSON object"),
    ("", "test.jsonl holds no rows"),
], ids=["no_answer", "broken_line", "empty"])
def test_benchmark_gsm8k_loaders_name_the_file_and_line(tmp_path, monkeypatch, test, fragment):
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    import fewshot
    import throughput

    d = _gsm8k_dir(tmp_path, test)
    with pytest.raises(SystemExit) as exc:
        fewshot.read_rows(d / "test.jsonl")
    assert str(exc.value).startswith("--gsm8k: ") and fragment in str(exc.value)
    with pytest.raises(SystemExit) as exc:
        throughput.load_prompts(None, 4, str(d))
    assert str(exc.value).startswith(f"--gsm8k {d}: ") and fragment in str(exc.value)
