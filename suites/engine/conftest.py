"""Engine suites: tiny seeded models on a 2-core CPU."""

import pytest
import torch

from kvcm.models import tiny_model


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Tiny matmuls on a busy 2-core machine: one intra-op thread is ~50x faster than oversubscribed two."""
    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(saved)


@pytest.fixture(scope="session")
def target():
    """The speculation suites' target: a seeded 4-layer tiny llama (the same weights in every module)."""
    return tiny_model("llama", num_hidden_layers=4)[0]
