"""The real models for tests: loaded, or the test skipped with the line that installs them.

``kvcm.models`` loads SmolLM2 and Gemma 3 and raises ``ModelNotInstalled`` (naming the install line) when a
model's package is absent; a test would rather skip with that line than fail. The skip is pytest's, so it lives
with the plugin, and the library stays free of pytest.
"""

from __future__ import annotations

import pytest

from kvcm.models import ModelNotInstalled, load_smollm2


def require_smollm2(**kwargs):
    """``kvcm.models.load_smollm2``, or ``pytest.skip`` with the install hint when the model is not installed."""
    try:
        return load_smollm2(**kwargs)
    except ModelNotInstalled as exc:
        pytest.skip(str(exc))


def require_gemma3(**kwargs):
    """``kvcm.models.gemma3.load_gemma3``, or ``pytest.skip`` naming the install line when it is not installed."""
    from kvcm.models.gemma3 import load_gemma3

    try:
        return load_gemma3(**kwargs)
    except ModelNotInstalled as exc:
        pytest.skip(str(exc))
