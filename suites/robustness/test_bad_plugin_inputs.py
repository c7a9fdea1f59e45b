"""Bad plugin options and input files: pytest stops at start-up with a usage error naming the option and, for
a file, the file and line; never an ``INTERNALERROR`` and never a failure deep inside a test.

Before, a lane or waive file that was not UTF-8 raised ``INTERNALERROR`` (``UnicodeDecodeError``), and a bad
``--kvcm-gsm8k``, ``--kvcm-results``, ``--kvcm-machine`` or ini ``kvcm_version`` was accepted at start-up and
only failed (if ever) inside the first test that read it.
"""

from __future__ import annotations

import json

import pytest


@pytest.fixture
def run(pytester):
    pytester.makeini("[pytest]\naddopts = -p no:cacheprovider -p no:hypothesispytest -p no:randomly\n")
    pytester.makepyfile("def test_ok():\n    pass\n")

    def go(*args):
        return pytester.runpytest_inprocess(*args)

    return go


def _files(pytester):
    root = pytester.path
    (root / "bin.txt").write_bytes(b"\xff\xfe\x00bad")
    (root / "notdb.db").write_text("not sqlite")
    (root / "emptydir").mkdir()
    (root / "gsm").mkdir()
    (root / "gsm" / "test.jsonl").write_text(json.dumps({"question": "1+1?", "answer": "#### 2"}) + "\n{broken\n")
    (root / "gsm_keys").mkdir()
    (root / "gsm_keys" / "test.jsonl").write_text(json.dumps({"question": "1+1?", "label": 2}) + "\n")
    (root / "refs").mkdir()
    (root / "refs" / "gsm8k.yaml").write_text("model:\n  - accuracy: [1\n")
    (root / "lanes").mkdir()
    (root / "lanes" / "l8.yml").write_bytes(b"l8:\n  - tests: [\xff]\n")
    (root / "lanes" / "l9.yml").write_text("l9:\n  - tests: [a\n")
    (root / "machine.json").write_text('{"gpu_count": "many"}')
    return root


# (case id, arguments, fragment of the usage error)
CASES = [
    ("ini_version", ["-o", "kvcm_version=v3"], "kvcm_version='v3' is invalid: choose one of v1, v2, both, auto"),
    ("gpus_per_worker_negative", ["--kvcm-gpus-per-worker=-1"], "--kvcm-gpus-per-worker=-1: must be >= 0"),
    ("ini_gpus_per_worker", ["-o", "kvcm_gpus_per_worker=two"], "ini kvcm_gpus_per_worker='two': must be an integer"),
    ("results_directory", ["--kvcm-results={root}/emptydir"], "emptydir: is a directory"),
    ("results_not_sqlite", ["--kvcm-results={root}/notdb.db"], "notdb.db: exists but is not an SQLite database"),
    ("results_under_a_file", ["--kvcm-results={root}/bin.txt/x.db"], "is not a writable directory"),
    ("gsm8k_missing", ["--kvcm-gsm8k={root}/nope.jsonl"], "nope.jsonl: no such file or directory"),
    ("gsm8k_empty_dir", ["--kvcm-gsm8k={root}/emptydir"], "the directory has no test.jsonl"),
    ("gsm8k_bad_line", ["--kvcm-gsm8k={root}/gsm"], "gsm/test.jsonl:2: not a JSON object"),
    ("gsm8k_wrong_keys", ["--kvcm-gsm8k={root}/gsm_keys"], "test.jsonl:1: a row needs string 'question' and "
                                                           "'answer' fields"),
    ("gsm8k_binary", ["--kvcm-gsm8k={root}/bin.txt"], "bin.txt:1: not UTF-8 text"),
    ("gsm8k_limit_zero", ["--kvcm-gsm8k-limit=0"], "--kvcm-gsm8k-limit=0: must be >= 1"),
    ("references_missing", ["--kvcm-references={root}/nope"], "nope: no such directory"),
    ("references_bad_yaml", ["--kvcm-references={root}/refs"], "refs/gsm8k.yaml:3: invalid YAML"),
    ("lane_not_utf8", ["--kvcm-lane-dir={root}/lanes", "--kvcm-lane=l8"], "l8.yml:2: not UTF-8 text"),
    ("lane_bad_yaml", ["--kvcm-lane-dir={root}/lanes", "--kvcm-lane=l9"], "l9.yml:3: invalid YAML"),
    ("waives_not_utf8", ["--kvcm-waives={root}/bin.txt"], "bin.txt:1: not UTF-8 text"),
    ("machine_not_json", ["--kvcm-machine=bogus"], "--kvcm-machine='bogus': neither a JSON object nor an existing"),
    ("machine_bad_count", ["--kvcm-machine={root}/machine.json"], "gpu_count='many' must be an integer in [0, 1024]"),
    ("machine_not_utf8", ["--kvcm-machine={root}/bin.txt"], "bin.txt:1: not UTF-8 text"),
]


@pytest.mark.parametrize("args, fragment", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_option_or_file_is_a_usage_error_at_start_up(pytester, run, args, fragment):
    root = _files(pytester)
    result = run(*[a.format(root=root) for a in args])
    text = result.stdout.str() + result.stderr.str()
    assert result.ret == pytest.ExitCode.USAGE_ERROR, text
    assert "INTERNALERROR" not in text and "Traceback" not in text
    assert fragment in text
    assert "passed" not in result.stdout.str()  # stopped before running anything


def test_good_gsm8k_file_passes_the_start_up_check(pytester, run):
    (pytester.path / "gsm").mkdir()
    rows = [{"question": f"{i}+1?", "answer": f"#### {i + 1}"} for i in range(3)]
    (pytester.path / "gsm" / "test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    run(f"--kvcm-gsm8k={pytester.path}/gsm").assert_outcomes(passed=1)
