"""Reference lookup: key-by-key match, first entry wins, clear errors; the committed YAML files load."""

from pathlib import Path

import pytest

from pytest_kvcm.accuracy import ReferenceError, entry_yaml, lookup_reference
from pytest_kvcm.accuracy.references import load_references

ROOT = Path(__file__).resolve().parents[2]

REFS = """
org/model:
  - accuracy: 60.0
  - quant_algo: FP8
    accuracy: 59.0
  - quant_algo: FP8
    accuracy: 1.0            # shadowed: the first FP8 entry wins
  - quant_algo: FP8
    kv_cache_quant_algo: FP8
    accuracy: 58.0
    sigma: 40
    num_samples: 256
  - dtype: bfloat16
    accuracy: 61.0
  - spec_dec_algo: Eagle3
    extra_acc_spec: use_sa_spec
    accuracy: 62.0
other/model:
  - quant_algo: NVFP4
    accuracy: 40.0
"""


@pytest.fixture
def refdir(tmp_path):
    (tmp_path / "task.yaml").write_text(REFS)
    return tmp_path


def look(refdir, model="org/model", **spec):
    return lookup_reference("task", model, spec, reference_dir=refdir)


def test_default_spec_matches_the_entry_without_keys(refdir):
    ref = look(refdir)
    assert (ref.accuracy, ref.index) == (60.0, 0)
    assert ref.spec == {"dtype": "auto", "quant_algo": None, "kv_cache_quant_algo": None,
                        "spec_dec_algo": None, "extra_acc_spec": None}


def test_every_key_must_match_and_first_wins(refdir):
    assert look(refdir, quant_algo="FP8").accuracy == 59.0
    ref = look(refdir, quant_algo="FP8", kv_cache_quant_algo="FP8")
    assert (ref.accuracy, ref.stats) == (58.0, {"sigma": 40, "num_samples": 256})
    assert look(refdir, dtype="bfloat16").accuracy == 61.0
    assert look(refdir, dtype="auto").accuracy == 60.0
    assert look(refdir, spec_dec_algo="Eagle3", extra_acc_spec="use_sa_spec").accuracy == 62.0


def test_an_entry_key_missing_from_the_spec_means_none(refdir):
    """An entry with quant_algo=NVFP4 must not serve an unquantized run (TRT-LLM semantics)."""
    with pytest.raises(ReferenceError) as e:
        look(refdir, "other/model")
    msg = str(e.value)
    assert "other/model" in msg and "'quant_algo': None" in msg and "NVFP4" in msg


def test_no_match_names_model_and_spec(refdir):
    with pytest.raises(ReferenceError) as e:
        look(refdir, spec_dec_algo="Eagle3")
    msg = str(e.value)
    assert "org/model" in msg and "'spec_dec_algo': 'Eagle3'" in msg and "measure" in msg
    with pytest.raises(ReferenceError, match="no task reference for model 'nobody/x'.*known models"):
        look(refdir, "nobody/x")


@pytest.mark.parametrize("key", ["kvcm_version", "manager_version", "cuda_graphs", "tp_size"])
def test_manager_graphs_and_parallelism_are_not_spec_keys(refdir, key):
    with pytest.raises(ValueError, match=f"'{key}' is not an accuracy spec key"):
        look(refdir, **{key: "v2"})


def test_unknown_spec_key(refdir):
    with pytest.raises(ValueError, match="unknown accuracy spec key 'qunat_algo'"):
        look(refdir, qunat_algo="FP8")


@pytest.mark.parametrize("text,match", [
    ("m:\n  - accuracy: 1\n    kv_manager: v2\n", r"entry 0 has unknown key\(s\) \['kv_manager'\]"),
    ("m:\n  - quant_algo: FP8\n", "'accuracy' must be a number, got None"),
    ("m:\n  accuracy: 1\n", "must hold a list of entries"),
    ("- 1\n", "top level must map"),
])
def test_malformed_files_name_the_problem(tmp_path, text, match):
    (tmp_path / "task.yaml").write_text(text)
    with pytest.raises(ReferenceError, match=match):
        lookup_reference("task", "m", reference_dir=tmp_path)


def test_missing_task_file(tmp_path):
    with pytest.raises(ReferenceError, match="no reference file for task 'nope'"):
        lookup_reference("nope", "m", reference_dir=tmp_path)


def test_entry_yaml_round_trips(tmp_path):
    text = entry_yaml("org/m", 41.23456, {"quant_algo": "FP8", "dtype": "auto"}, num_samples=48)
    assert text == "org/m:\n  - quant_algo: FP8\n    accuracy: 41.235\n    num_samples: 48\n"
    (tmp_path / "t.yaml").write_text(text)
    ref = lookup_reference("t", "org/m", {"quant_algo": "FP8"}, reference_dir=tmp_path)
    assert (ref.accuracy, ref.stats) == (41.235, {"num_samples": 48})


@pytest.mark.parametrize("task", sorted(p.stem for p in (ROOT / "ci" / "references").glob("*.yaml")))
def test_committed_reference_files_load(task):
    path, data = load_references(task, ROOT / "ci" / "references")
    assert data, f"{path} is empty"


def test_published_llama_reference():
    ref = lookup_reference("gsm8k", "meta-llama/Llama-3.1-8B-Instruct", {}, reference_dir=ROOT / "ci" / "references")
    assert ref.accuracy == 74.20
    fp8 = lookup_reference("gsm8k", "meta-llama/Llama-3.1-8B-Instruct",
                           {"quant_algo": "FP8", "kv_cache_quant_algo": "FP8"},
                           reference_dir=ROOT / "ci" / "references")
    assert fp8.accuracy == 72.85
