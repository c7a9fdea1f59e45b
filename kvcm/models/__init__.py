"""Models the reference engine and its suites run on, and the uncached baseline they are compared with.

This is support for tests and benchmarks, not part of the engine: the engine (``kvcm.engine``) takes any
Hugging Face causal LM. ``smollm2`` loads the real model from its GGUF, ``tiny`` builds seeded random models and
truncated drafters, ``shapes`` random models at real models' shapes, ``baseline`` runs Hugging Face ``generate``.
"""

from .baseline import GenOutput, chat_prompt_ids, hf_generate
from .smollm2 import (INSTALL_HINT, SMOLLM2_GGUF_NAME, SMOLLM2_NAME, SMOLLM2_PACKAGE, ModelNotInstalled,
                      find_smollm2_gguf, load_smollm2, smollm2_cache_dir)
from .shapes import SMOLLM2_135M, gemma3_shape, llama4_shape, smollm2_shape
from .tiny import TINY_ARCHS, TINY_INIT_STD, tiny_llama4, tiny_model, truncated_drafter

__all__ = [
    "GenOutput", "chat_prompt_ids", "hf_generate", "INSTALL_HINT", "SMOLLM2_GGUF_NAME", "SMOLLM2_NAME",
    "SMOLLM2_PACKAGE", "ModelNotInstalled", "find_smollm2_gguf", "load_smollm2", "smollm2_cache_dir", "TINY_ARCHS",
    "TINY_INIT_STD", "tiny_llama4", "tiny_model", "truncated_drafter", "SMOLLM2_135M", "gemma3_shape",
    "llama4_shape", "smollm2_shape",
]
