"""The reference inference engine: Hugging Face causal LMs decoding over a kvcm manager's paged KV cache."""
from .llm import LLM, RequestOutput
from .sequence import SamplingParams

__all__ = ["LLM", "RequestOutput", "SamplingParams"]
