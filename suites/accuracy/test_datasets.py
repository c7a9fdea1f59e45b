"""GSM8K loading through ``datasets``: a tmp jsonl, parquet, the embedded set, and the real GSM8K files."""

import hashlib
import json
from pathlib import Path

import pytest

datasets = pytest.importorskip("datasets", reason="GSM8K loading needs the 'datasets' package (extra: hf)")

from pytest_kvcm.accuracy import arith, load_gsm8k  # noqa: E402
from pytest_kvcm.accuracy.gsm8k import EMBEDDED, target_answer  # noqa: E402

from _real_gsm8k import REAL  # noqa: E402
REAL_SHA256 = {"test.jsonl": "3730d312f6e3440559ace48831e51066acaca737f6eabec99bccb9e4b3c39d14",
               "train.jsonl": "17f347dc51477c50d4efb83959dbb7c56297aba886e5544ee2aaed3024813465"}
ROWS = [{"question": f"What is {i} + {i}?", "answer": f"{i} + {i} = <<{i}+{i}={2 * i}>>{2 * i}\n#### {2 * i}"}
        for i in range(1, 7)]


def write_jsonl(path: Path, rows) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_directory_with_both_splits(tmp_path):
    write_jsonl(tmp_path / "test.jsonl", ROWS[:4])
    write_jsonl(tmp_path / "train.jsonl", ROWS[4:])
    data = load_gsm8k(tmp_path)
    assert isinstance(data.test, datasets.Dataset)
    assert len(data.test) == 4 and len(data.train) == 2
    assert data.test[0]["question"] == "What is 1 + 1?"
    assert data.source == str(tmp_path)


def test_single_file_finds_its_train_sibling(tmp_path):
    write_jsonl(tmp_path / "gsm_test.jsonl", ROWS[:3])
    assert load_gsm8k(tmp_path / "gsm_test.jsonl").train is None
    write_jsonl(tmp_path / "gsm_train.jsonl", ROWS[3:])
    data = load_gsm8k(tmp_path / "gsm_test.jsonl")
    assert (len(data.test), len(data.train)) == (3, 3)


def test_parquet_in_the_hub_layout(tmp_path):
    (tmp_path / "main").mkdir()
    datasets.Dataset.from_list(ROWS[:5]).to_parquet(str(tmp_path / "main" / "test-00000-of-00001.parquet"))
    datasets.Dataset.from_list(ROWS[5:]).to_parquet(str(tmp_path / "main" / "train-00000-of-00001.parquet"))
    data = load_gsm8k(tmp_path)
    assert (len(data.test), len(data.train)) == (5, 1)
    single = load_gsm8k(tmp_path / "main" / "test-00000-of-00001.parquet")
    assert len(single.test) == 5 and len(single.train) == 1


def test_errors_name_the_path_and_columns(tmp_path):
    with pytest.raises(FileNotFoundError, match="has no test.jsonl"):
        load_gsm8k(tmp_path)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_gsm8k(tmp_path / "missing.jsonl")
    write_jsonl(tmp_path / "test.jsonl", [{"q": "x", "a": "1"}])
    with pytest.raises(ValueError, match=r"missing \['answer', 'question'\]"):
        load_gsm8k(tmp_path)


def test_embedded_default():
    data = load_gsm8k()
    assert data.source == EMBEDDED
    assert (len(data.test), len(data.train)) == (arith.NUM_TEST, arith.NUM_TRAIN)
    for row in list(data.test) + list(data.train):
        assert "\n#### " in row["answer"] and target_answer(row["answer"]).isdigit()


def test_embedded_files_are_what_the_generator_writes():
    for name, text in arith.expected_files().items():
        assert (arith.DATA_DIR / name).read_text() == text, "regenerate with python -m pytest_kvcm.accuracy.arith"


def test_generator_is_seeded_and_its_arithmetic_is_right():
    import re

    assert arith.generate(8, 1) == arith.generate(8, 1) != arith.generate(8, 2)
    for row in arith.generate(64, 3):
        for expr, result in re.findall(r"<<([^=]+)=(\d+)>>", row["answer"]):
            assert eval(expr) == int(result), row  # noqa: S307 - our own generated digits and operators
        last = re.findall(r"<<[^=]+=(\d+)>>", row["answer"])[-1]
        assert row["answer"].endswith(f"#### {last}")


@pytest.mark.skipif(not (REAL / "test.jsonl").is_file(), reason=f"real GSM8K not present at {REAL}")
def test_real_gsm8k():
    for name, digest in REAL_SHA256.items():
        assert hashlib.sha256((REAL / name).read_bytes()).hexdigest() == digest, name
    data = load_gsm8k(REAL)
    assert (len(data.test), len(data.train)) == (1319, 7473)
    assert target_answer(data.test[0]["answer"]) == "18"  # Janet's ducks
    assert all(target_answer(r["answer"]).lstrip("-").replace(".", "").isdigit() for r in data.test)
