"""Reference accuracies: ``ci/references/<task>.yaml``, model name -> list of entries.

An entry names the accuracy and the *accuracy spec* it was measured under (``dtype``, ``quant_algo``,
``kv_cache_quant_algo``, ``spec_dec_algo``, ``extra_acc_spec``) and may override the test's statistics
(``alpha``, ``beta``, ``sigma``, ``num_samples``). Lookup follows TensorRT-LLM: the first entry whose value for
*every* spec key equals the run's wins; a key missing on either side counts as None (``dtype`` as ``"auto"``),
so an entry without ``quant_algo`` only matches unquantized runs. KV manager version, CUDA graphs and
parallelism are deliberately not spec keys: V1 and V2 (and TP=1 vs TP=8) must reproduce one reference, and a
run that passes one of them as a spec key is refused rather than silently given its own reference.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import yaml

SPEC_KEYS = ("dtype", "quant_algo", "kv_cache_quant_algo", "spec_dec_algo", "extra_acc_spec")
SPEC_DEFAULTS = {"dtype": "auto"}
STAT_KEYS = ("alpha", "beta", "sigma", "num_samples", "higher_is_better")
ENTRY_KEYS = frozenset(("accuracy", *SPEC_KEYS, *STAT_KEYS))
# Things people are tempted to gate on; each must reproduce the same reference instead.
NOT_SPEC_KEYS = {
    "kvcm_version": "V1 and V2 must reproduce the same reference",
    "manager_version": "V1 and V2 must reproduce the same reference",
    "kv_manager": "V1 and V2 must reproduce the same reference",
    "version": "V1 and V2 must reproduce the same reference",
    "cuda_graphs": "CUDA graphs must not change accuracy",
    "cuda_graph": "CUDA graphs must not change accuracy",
    "tp_size": "parallelism must not change accuracy",
    "pp_size": "parallelism must not change accuracy",
    "cp_size": "parallelism must not change accuracy",
    "ep_size": "parallelism must not change accuracy",
}


class ReferenceError(LookupError):
    """No usable reference: the message names the file, the model and the spec."""


@dataclass(frozen=True)
class Reference:
    task: str
    model: str
    accuracy: float
    spec: dict[str, Any]  # the selecting entry's spec keys, defaults filled in
    stats: dict[str, Any] = field(default_factory=dict)  # alpha/beta/sigma/num_samples overrides
    index: int = 0  # position of the entry in the model's list
    path: str = ""


def default_reference_dir() -> Path:
    """``ci/references`` of the checkout this package lives in (``KVCM_REFERENCE_DIR`` overrides)."""
    env = os.environ.get("KVCM_REFERENCE_DIR")
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[2] / "ci" / "references"


def normalize_spec(spec: Mapping[str, Any] | None) -> dict[str, Any]:
    """Full spec with defaults; refuses unknown keys and the keys that must not select a reference."""
    spec = dict(spec or {})
    for key in spec:
        if key in NOT_SPEC_KEYS:
            raise ValueError(f"{key!r} is not an accuracy spec key ({NOT_SPEC_KEYS[key]}); spec keys are {SPEC_KEYS}")
        if key not in SPEC_KEYS:
            raise ValueError(f"unknown accuracy spec key {key!r} (value {spec[key]!r}); spec keys are {SPEC_KEYS}")
    return {k: spec.get(k, SPEC_DEFAULTS.get(k)) for k in SPEC_KEYS}


def load_references(task: str, reference_dir: str | os.PathLike | None = None) -> tuple[Path, dict[str, list[dict]]]:
    path = Path(reference_dir or default_reference_dir()) / f"{task}.yaml"
    if not path.is_file():
        raise ReferenceError(f"no reference file for task {task!r}: {path} does not exist")
    data = yaml.safe_load(path.read_text()) or {}
    if not isinstance(data, dict):
        raise ReferenceError(f"{path}: top level must map model name -> list of entries, got {type(data).__name__}")
    for model, entries in data.items():
        if not isinstance(entries, list):
            raise ReferenceError(f"{path}: model {model!r} must hold a list of entries, got {type(entries).__name__}")
        for i, entry in enumerate(entries):
            where = f"{path}: {model!r} entry {i}"
            if not isinstance(entry, dict):
                raise ReferenceError(f"{where} must be a mapping, got {entry!r}")
            unknown = set(entry) - ENTRY_KEYS
            if unknown:
                raise ReferenceError(f"{where} has unknown key(s) {sorted(unknown)}; allowed: {sorted(ENTRY_KEYS)}")
            acc = entry.get("accuracy")
            if isinstance(acc, bool) or not isinstance(acc, (int, float)):
                raise ReferenceError(f"{where}: 'accuracy' must be a number, got {acc!r}")
    return path, data


def lookup_reference(
    task: str, model: str, spec: Mapping[str, Any] | None = None, *, reference_dir: str | os.PathLike | None = None
) -> Reference:
    """The first entry of ``model`` whose spec equals ``spec`` key by key (see the module docstring)."""
    want = normalize_spec(spec)
    path, data = load_references(task, reference_dir)
    if model not in data:
        raise ReferenceError(
            f"no {task} reference for model {model!r} (spec {want}) in {path}; known models: {sorted(data)}. "
            f"Run with --kvcm-accuracy=measure to get the entry to add."
        )
    entries = data[model]
    for i, entry in enumerate(entries):
        have = {k: entry.get(k, SPEC_DEFAULTS.get(k)) for k in SPEC_KEYS}
        if have == want:
            stats = {k: entry[k] for k in STAT_KEYS if k in entry}
            return Reference(task, model, float(entry["accuracy"]), have, stats, i, str(path))
    listed = "; ".join(
        str({k: e[k] for k in SPEC_KEYS if k in e} or "{default spec}") for e in entries
    )
    raise ReferenceError(
        f"no {task} reference for model {model!r} with spec {want} in {path}; its entries have specs: {listed}. "
        f"Run with --kvcm-accuracy=measure to get the entry to add."
    )


def entry_yaml(model: str, accuracy: float, spec: Mapping[str, Any] | None = None, num_samples: int | None = None) -> str:
    """The YAML to paste under ``model`` (measure mode): only the non-default spec keys are written."""
    full = normalize_spec(spec)
    entry: dict[str, Any] = {k: v for k, v in full.items() if v != SPEC_DEFAULTS.get(k)}
    entry["accuracy"] = round(float(accuracy), 3)
    if num_samples is not None:
        entry["num_samples"] = int(num_samples)
    body = yaml.safe_dump([entry], sort_keys=False, default_flow_style=False)
    return f"{model}:\n" + "".join("  " + line + "\n" for line in body.splitlines())
