"""Engine suites: tiny seeded models on a 2-core CPU."""

import pytest
import torch


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Tiny matmuls on a busy 2-core machine: one intra-op thread is ~50x faster than oversubscribed two."""
    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(saved)
