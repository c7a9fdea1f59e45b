"""Accuracy gates: thresholds, references, GSM8K (see docs/semantics.md section 8)."""

from .gate import MODES, SMOKE_SAMPLES, AccuracyGate, AccuracyGateError, GateOutcome
from .gsm8k import (GSM8KData, GSM8KResult, evaluate_gsm8k, extract_answer, hf_generate_fn, kvcm_generate_fn,
                    load_gsm8k, normalize)
from .references import Reference, ReferenceError, SPEC_KEYS, entry_yaml, lookup_reference
from .thresholds import Threshold, compute_threshold, min_samples_to_fail

__all__ = [
    "MODES", "SMOKE_SAMPLES", "SPEC_KEYS", "AccuracyGate", "AccuracyGateError", "GSM8KData", "GSM8KResult",
    "GateOutcome", "Reference", "ReferenceError", "Threshold", "compute_threshold", "entry_yaml",
    "evaluate_gsm8k", "extract_answer", "hf_generate_fn", "kvcm_generate_fn", "load_gsm8k", "lookup_reference",
    "min_samples_to_fail", "normalize",
]
