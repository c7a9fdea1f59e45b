"""``--kvcm-gsm8k``, ``--kvcm-gsm8k-limit`` and ``--kvcm-references`` checked when pytest starts.

The GSM8K data is read by the first accuracy test and the references by the first gate, minutes into a run: a
bad file then surfaced as an ``INTERNALERROR`` or a trace from deep inside ``datasets``. The accuracy
sub-plugin calls these from its ``pytest_configure``, so a bad one stops the run with a ``pytest.UsageError``
naming the option, the value and, for a file, the file and line.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from ..lanes.file_format import read_text, yaml_where
from .gsm8k import split_file
from .gsm8k_rows import GSM8KFileError, numbered_rows


def check_gsm8k(config: pytest.Config) -> None:
    limit = config.getoption("kvcm_gsm8k_limit", None)
    if limit is not None and limit < 1:
        raise pytest.UsageError(f"--kvcm-gsm8k-limit={limit}: must be >= 1")
    source = config.getoption("kvcm_gsm8k", None)
    if not source:
        return
    path = Path(os.path.expanduser(source))
    where = f"--kvcm-gsm8k={source}"
    if path.is_dir():
        found = split_file(path, "test")
        if found is None:
            raise pytest.UsageError(f"{where}: the directory has no test.jsonl, test.json, test.parquet or "
                                    "**/test-*.parquet")
        files = [found[1]] if isinstance(found[1], str) else found[1]
        train = split_file(path, "train")
        if train is not None:
            files += [train[1]] if isinstance(train[1], str) else train[1]
    elif path.is_file():
        files = [str(path)]
    elif str(source).startswith((".", "/", "~")) or path.suffix in (".jsonl", ".json", ".parquet"):
        raise pytest.UsageError(f"{where}: no such file or directory")
    else:
        return  # a hub id: only the hub can tell
    for file in files:
        check_gsm8k_file(Path(file), where)


def check_gsm8k_file(path: Path, where: str) -> None:
    """Rows of ``question`` and ``answer`` strings, as the loader needs them."""
    if path.suffix == ".parquet":
        try:
            import pyarrow.parquet as pq

            names = set(pq.read_schema(path).names)
        except Exception as e:  # noqa: BLE001 - any unreadable parquet is the user's file, not a plugin bug
            raise pytest.UsageError(f"{where}: {path} is not a readable parquet file ({type(e).__name__}: {e})") \
                from None
        if not {"question", "answer"} <= names:
            raise pytest.UsageError(f"{where}: {path} needs columns 'question' and 'answer'; has {sorted(names)}")
        return
    try:
        numbered_rows(path)
    except GSM8KFileError as e:
        raise pytest.UsageError(f"{where}: {e}") from None


def check_references(config: pytest.Config) -> None:
    opt = config.getoption("kvcm_references", None)
    if not opt:
        return
    root = Path(os.path.expanduser(opt))
    if not root.is_dir():
        raise pytest.UsageError(f"--kvcm-references={opt}: no such directory")
    for path in sorted(root.glob("*.yaml")):
        shown = str(path)
        try:
            data = yaml.safe_load(read_text(path, shown))
        except yaml.YAMLError as e:
            raise pytest.UsageError(f"--kvcm-references: {yaml_where(e, shown)}: invalid YAML: "
                                    f"{getattr(e, 'problem', None) or e}") from None
        if data is not None and not isinstance(data, dict):
            raise pytest.UsageError(f"--kvcm-references: {shown}:1: top level must map model name -> list of "
                                    f"entries, got {type(data).__name__}")
