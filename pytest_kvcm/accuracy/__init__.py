"""Accuracy gates: thresholds, references, GSM8K."""
