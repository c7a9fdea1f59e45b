"""The GPU smoke tests' models: random weights at the real shapes (``kvcm.models.shapes``), built once a session on
the smoke device at its scale (``_smoke.SCALE``). Nothing is staged: no GGUF, no dataset, no network."""
import pytest

from kvcm.models import gemma3_shape, llama4_shape, smollm2_shape

from _smoke import DEVICE, SCALE


@pytest.fixture(scope="session")
def smollm2():
    """SmolLM2-135M's shape (30 layers on CUDA)."""
    return smollm2_shape(num_hidden_layers=SCALE.smollm2_layers, device=DEVICE)


@pytest.fixture(scope="session")
def gemma3():
    """Gemma 3 270M's shape: five sliding layers to one global, one KV head of 256, 262,144 ids."""
    return gemma3_shape(num_hidden_layers=SCALE.gemma3_layers, sliding_window=SCALE.gemma3_window, device=DEVICE)


@pytest.fixture(scope="session")
def llama4():
    """Four layers of Llama 4 Scout's shape (three chunked-local, one global without RoPE), two experts."""
    return llama4_shape(chunk=SCALE.llama4_chunk, mlp_width=SCALE.llama4_mlp, device=DEVICE)
