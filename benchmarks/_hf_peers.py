"""The Hugging Face peers ``throughput.py`` measures kvcm beside: ``generate`` (static batches, left padding) and
transformers' own continuous batching (``generate_batch``). Each takes the same prompts and returns the same
``kvcm.models.GenOutput`` list as the kvcm engine, so one run compares tokens and times across all of them.
"""

from __future__ import annotations

import inspect
import time

import torch


class HfGenerate:
    def __init__(self, model, tok, prompts, max_new, batch_size, device):
        from kvcm.engine.llm import eos_token_ids
        self.model, self.max_new, self.batch_size = model, max_new, batch_size
        self.eos = list(eos_token_ids(model, tok))
        t = time.perf_counter()
        self(prompts[:2])
        self.setup_s = time.perf_counter() - t

    def __call__(self, prompts):
        from kvcm.models import hf_generate
        return hf_generate(self.model, prompts, self.max_new, eos_token_id=self.eos, batch_size=self.batch_size,
                           margins=False)

    def describe(self):
        return {"setup_s": round(self.setup_s, 2)}

    def close(self):
        pass


class HfGenerateBatch:
    """transformers' continuous batching. Its config's page field is ``block_size`` on 5.17 and ``page_size``
    on 5.24; older releases want the paged attention implementation named explicitly."""

    def __init__(self, model, tok, prompts, max_new, batch_size, device):
        from transformers import GenerationConfig
        from kvcm.engine.llm import eos_token_ids
        self.model = model
        self.gen = GenerationConfig(max_new_tokens=max_new, do_sample=False,
                                    eos_token_id=list(eos_token_ids(model, tok)), pad_token_id=tok.pad_token_id)
        self.kwargs = {}
        params = inspect.signature(model.generate_batch).parameters
        from transformers.generation import ContinuousBatchingConfig
        fields = inspect.signature(ContinuousBatchingConfig).parameters
        page = "page_size" if "page_size" in fields else "block_size"
        max_seq = max(len(p) for p in prompts) + max_new + 8
        cfg = {page: 32, "max_requests_per_batch": batch_size, "max_batch_tokens": 8192}
        if torch.device(device).type != "cuda":
            cfg["num_blocks"] = batch_size * (max_seq // 32 + 2)
        self.kwargs["continuous_batching_config"] = ContinuousBatchingConfig(**cfg)
        if "warmup" in params and torch.device(device).type != "cuda":
            self.kwargs["warmup"] = False
        t = time.perf_counter()
        self(prompts[:2])
        self.setup_s = time.perf_counter() - t

    def _run(self, prompts):
        return self.model.generate_batch(prompts, generation_config=self.gen, progress_bar=False, **self.kwargs)

    def __call__(self, prompts):
        from kvcm.models import GenOutput
        try:
            res = self._run(prompts)
        except ValueError as exc:
            if "attn" not in str(exc) and "paged" not in str(exc):
                raise
            self.model.set_attn_implementation("sdpa_paged")
            res = self._run(prompts)
        by_id = {str(k): v for k, v in res.items()}
        keys = sorted(by_id, key=lambda k: int(k.rsplit("_", 1)[-1]))
        return [GenOutput(list(by_id[k].generated_tokens)) for k in keys]

    def describe(self):
        return {"setup_s": round(self.setup_s, 2)}

    def close(self):
        destroy = getattr(self.model, "destroy_cached_continuous_batching_manager", None)
        if destroy is not None:
            destroy()
        self.model.set_attn_implementation("sdpa")
