"""The Hugging Face ``generate`` baseline (greedy, batched, left padding) with per-token margins, and chat prompts.

The engine's outputs are compared with these: same model, no paged cache.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

@dataclass
class GenOutput:
    """One generated sequence (prompt excluded), cut after the first EOS, with top1 - top2 logit margins."""

    token_ids: list[int]
    logits_margins: list[float] = field(default_factory=list)


def _margins(logits: torch.Tensor) -> torch.Tensor:
    top2 = torch.topk(logits.float(), 2, dim=-1).values
    return top2[..., 0] - top2[..., 1]


@torch.inference_mode()
def hf_generate(model, prompts: list[list[int]], max_new_tokens: int, eos_token_id=None, batch_size: int = 32,
                pad_token_id: int | None = None, margins: bool = True, **generate_kwargs) -> list[GenOutput]:
    """Greedy Hugging Face ``generate`` in batches with left padding. Output i belongs to prompt i; tokens after
    the first EOS (kept) are cut. Margins come from the raw logits (``output_logits=True``), not the processed
    scores, so they are the numbers a near-tie judgement needs; ``margins=False`` keeps no logits (the plain
    ``generate`` a throughput baseline should time). ``generate_kwargs`` go to ``generate`` as they are (a
    benchmark's ``stop_strings`` with its ``tokenizer``)."""
    if eos_token_id is None:
        eos_token_id = model.generation_config.eos_token_id
    eos = set(eos_token_id if isinstance(eos_token_id, (list, tuple)) else [eos_token_id]) - {None}
    if pad_token_id is None:
        pad_token_id = model.generation_config.pad_token_id
        if pad_token_id is None:
            pad_token_id = next(iter(eos), 0)
    device = next(model.parameters()).device
    outs: list[GenOutput] = []
    for lo in range(0, len(prompts), batch_size):
        chunk = prompts[lo:lo + batch_size]
        width = max(len(p) for p in chunk)
        ids = torch.full((len(chunk), width), pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(chunk), width), dtype=torch.long)
        for i, p in enumerate(chunk):
            ids[i, width - len(p):] = torch.tensor(p, dtype=torch.long)
            mask[i, width - len(p):] = 1
        res = model.generate(input_ids=ids.to(device), attention_mask=mask.to(device), do_sample=False,
                             max_new_tokens=max_new_tokens, min_new_tokens=0, eos_token_id=sorted(eos) or None,
                             pad_token_id=pad_token_id, return_dict_in_generate=True, output_logits=margins,
                             num_beams=1, temperature=None, top_p=None, top_k=None, **generate_kwargs)
        gen = res.sequences[:, width:].cpu()
        top = torch.stack([_margins(step) for step in res.logits], dim=1).cpu() if margins and res.logits else None
        for i in range(len(chunk)):
            toks = gen[i].tolist()
            n = len(toks)
            for j, t in enumerate(toks):
                if t in eos:
                    n = j + 1
                    break
            outs.append(GenOutput(toks[:n], top[i, :n].tolist() if top is not None else []))
    return outs


def chat_prompt_ids(tokenizer, text: str) -> list[int]:
    """Token ids of one user turn under the tokenizer's chat template, with the assistant prompt opened.
    (transformers 5 returns a BatchEncoding from ``apply_chat_template``; 4.x returned a list.)"""
    enc = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                        tokenize=True)
    ids = enc["input_ids"] if not isinstance(enc, list) else enc
    return [int(t) for t in ids]
