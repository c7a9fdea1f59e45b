"""Bad input on the engine API (``kvcm.engine.LLM``, ``generate``, ``SamplingParams``, the drafters): each raises
``kvcm.ConfigError`` naming the argument, the value and the limit before any page or forward is spent, and the
forms vLLM's ``LLM`` and transformers' ``generate`` accept are accepted (a string prompt with a tokenizer, one
prompt without a list, vLLM prompt dicts, an id tensor, a dict of sampling fields, a local model directory).

Before (issue #26): a path or None for the model died in ``model.to`` (``AttributeError``), a string prompt in
``int()``, an out-of-vocabulary id in the embedding (``IndexError``); negative, float and bool ids, ``overlap='yes'``,
``max_seq_len`` past the model's positions, bool pool sizes and ``stop_token_ids=5`` were accepted.
"""

from __future__ import annotations

import pytest
import torch

import kvcm
from kvcm.engine import LLM, SamplingParams
from kvcm.engine.drafters import ModelDrafter, NgramDrafter
from kvcm.models import tiny_model


@pytest.fixture(scope="module")
def model():
    return tiny_model("llama", seed=0)[0]


@pytest.fixture(scope="module")
def llm(model):
    return LLM(model, max_batch_size=4, max_seq_len=128)


def byte_tokenizer():
    """A real transformers tokenizer built offline: byte-level BPE with no merges, 256 ids (the tiny vocab)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    vocab = {c: i for i, c in enumerate(pre_tokenizers.ByteLevel.alphabet())}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=tok)


def _mk(model, **kw):
    return LLM(model, **({"max_batch_size": 4, "max_seq_len": 128} | kw))


# (case id, call taking (model, llm), field, value, limit fragment)
CASES = [
    ("model_path_missing", lambda m, e: LLM("no/such/model"), "model", "no/such/model", "local model directory"),
    ("model_none", lambda m, e: LLM(None), "model", None, "transformers causal LM"),
    ("model_int", lambda m, e: LLM(3), "model", 3, "transformers causal LM"),
    ("model_dict", lambda m, e: LLM({"hidden_size": 64}), "model", "dict", "transformers causal LM"),
    ("tokenizer_int", lambda m, e: LLM(m, 5), "tokenizer", 5, "encode() and decode()"),
    ("overlap_yes", lambda m, e: _mk(m, overlap="yes"), "overlap", "yes", "True or False"),
    ("trace_no", lambda m, e: _mk(m, trace="no"), "trace", "no", "True or False"),
    ("cuda_graph_string", lambda m, e: _mk(m, cuda_graph="false"), "cuda_graph", "false", "True or False"),
    ("graph_capture_int", lambda m, e: _mk(m, graph_capture=1), "graph_capture", 1, "True or False"),
    ("graph_batch_sizes_string", lambda m, e: _mk(m, cuda_graph=True, cuda_graph_batch_sizes="1,2"),
     "cuda_graph_batch_sizes", "1,2", "list of integers"),
    ("graph_buckets_zero", lambda m, e: _mk(m, cuda_graph=True, cuda_graph_token_buckets=[0, 8]),
     "cuda_graph_token_buckets[0]", 0, ">= 1"),
    ("decode_split_len_odd", lambda m, e: _mk(m, decode_split_len=48), "decode_split_len", 48, "multiple of 32"),
    ("decode_split_len_negative", lambda m, e: _mk(m, decode_split_len=-32), "decode_split_len", -32, ">= 0"),
    ("prefill_block_m_not_pow2", lambda m, e: _mk(m, prefill_block_m=48), "prefill_block_m", 48,
     "a power of two from 16"),
    ("prefill_block_m_too_large", lambda m, e: _mk(m, prefill_block_m=256), "prefill_block_m", 256, "to 128"),
    ("prefill_block_m_string", lambda m, e: _mk(m, prefill_block_m="64"), "prefill_block_m", "64",
     "an integer, not str"),
    ("max_seq_len_past_positions", lambda m, e: _mk(m, max_seq_len=100_000), "max_seq_len", 100_000,
     "<= 4096 (the model's max_position_embeddings)"),
    ("spec_window_negative", lambda m, e: _mk(m, spec_acceptance_window=-1), "spec_acceptance_window", -1, ">= 0"),
    ("spec_window_float", lambda m, e: _mk(m, spec_acceptance_window=2.5), "spec_acceptance_window", 2.5, "integer"),
    ("spec_threshold_above_one", lambda m, e: _mk(m, spec_acceptance_threshold=1.5), "spec_acceptance_threshold",
     1.5, "in [0, 1]"),
    ("spec_threshold_string", lambda m, e: _mk(m, spec_acceptance_threshold="0.5"), "spec_acceptance_threshold",
     "0.5", "a number in [0, 1]"),
    ("spec_threshold_bool", lambda m, e: _mk(m, spec_acceptance_threshold=True), "spec_acceptance_threshold", True,
     "a number in [0, 1]"),
    ("drafter_unknown", lambda m, e: _mk(m, drafter="eagle", max_draft_len=2), "drafter", "eagle", "'ngram'"),
    ("drafter_int", lambda m, e: _mk(m, drafter=5, max_draft_len=2), "drafter", 5, "'ngram'"),
    ("drafter_without_drafts", lambda m, e: _mk(m, drafter="ngram"), "max_draft_len", 0, ">= 1"),
    ("drafter_draft_len_mismatch", lambda m, e: _mk(m, drafter=NgramDrafter(2), max_draft_len=3), "max_draft_len",
     3, "num_draft=2"),
    ("draft_model_vocab", lambda m, e: _mk(m, drafter=tiny_model("llama", vocab_size=300)[0], max_draft_len=2),
     "drafter.config.vocab_size", 300, "vocab_size=256"),
    ("prefill_block_m_below_the_drafts_heads",   # 32 query heads a KV head: the draft's least tile is 32 rows
     lambda m, e: _mk(m, prefill_block_m=16, max_draft_len=2, drafter=tiny_model(
         "llama", num_attention_heads=32, num_key_value_heads=1, hidden_size=64)[0]),
     "prefill_block_m", 16, "(for the draft model) a power of two from 32"),
    ("draft_model_positions", lambda m, e: _mk(m, max_seq_len=120, max_draft_len=4,
                                               drafter=tiny_model("llama", max_position_embeddings=122)[0]),
     "max_seq_len + max_draft_len", 124, "<= 122 (the draft model's"),
    ("ngram_num_draft_bool", lambda m, e: NgramDrafter(True), "num_draft", True, "not a bool"),
    ("ngram_num_draft_negative", lambda m, e: NgramDrafter(-2), "num_draft", -2, ">= 1"),
    ("ngram_size_bool", lambda m, e: NgramDrafter(2, max_matching_ngram_size=True), "max_matching_ngram_size", True,
     "not a bool"),
    ("ngram_size_float", lambda m, e: NgramDrafter(2, max_matching_ngram_size=2.0), "max_matching_ngram_size", 2.0,
     "must be an integer"),
    ("ngram_keep_all_string", lambda m, e: NgramDrafter(2, is_keep_all="no"), "is_keep_all", "no", "True or False"),
    ("ngram_public_pool_string", lambda m, e: NgramDrafter(2, is_public_pool="no"), "is_public_pool", "no",
     "True or False"),
    ("model_drafter_num_draft_bool", lambda m, e: ModelDrafter(e.runner, True), "num_draft", True, "not a bool"),
    ("params_bool_tokens", lambda m, e: SamplingParams(max_new_tokens=True), "max_new_tokens", True, "not a bool"),
    ("params_stop_ids_int", lambda m, e: SamplingParams(stop_token_ids=5), "stop_token_ids", 5, "list of integers"),
    ("params_stop_ids_negative", lambda m, e: SamplingParams(stop_token_ids=[-1]), "stop_token_ids[0]", -1, ">= 0"),
    ("params_stop_string_empty", lambda m, e: SamplingParams(stop_strings=[""]), "stop_strings", [""], "non-empty"),
    ("params_ignore_eos_string", lambda m, e: SamplingParams(ignore_eos="yes"), "ignore_eos", "yes", "True or False"),
    ("params_vllm_max_tokens", lambda m, e: SamplingParams(max_tokens=3), "SamplingParams.max_tokens", 3,
     "max_new_tokens"),
    ("generate_params_int", lambda m, e: e.generate([[1, 2]], 5), "params", 5, "SamplingParams"),
    ("generate_params_dict_unknown", lambda m, e: e.generate([[1, 2]], {"temperature": 0.0}),
     "SamplingParams.temperature", 0.0, "is not a field"),
    ("generate_none", lambda m, e: e.generate(None), "prompts", None, "list of prompts"),
    ("generate_string_without_tokenizer", lambda m, e: e.generate(["hello"]), "prompts[0]", "hello",
     "needs a tokenizer"),
    ("generate_token_out_of_vocab", lambda m, e: e.generate([[1, 300]]), "prompts[0][1]", 300, "[0, 255]"),
    ("generate_token_negative", lambda m, e: e.generate([[1, -1]]), "prompts[0][1]", -1, "[0, 255]"),
    ("generate_token_float", lambda m, e: e.generate([[1, 2.5]]), "prompts[0][1]", 2.5, "must be an integer"),
    ("generate_token_bool", lambda m, e: e.generate([[True, 2]]), "prompts[0][0]", True, "not a bool"),
    ("generate_token_string", lambda m, e: e.generate([[1, "a"]]), "prompts[0][1]", "a", "must be an integer"),
    ("generate_empty_prompt", lambda m, e: e.generate([[1], []]), "prompts[1]", [], "at least one token"),
    ("generate_prompt_too_long", lambda m, e: e.generate([[1] * 200]), "len(prompts[0])", 200,
     "below max_seq_len=128"),
    ("generate_float_tensor", lambda m, e: e.generate(torch.ones(1, 3)), "prompts[0]", "tensor[3] torch.float32",
     "1-D integer tensor"),
    ("generate_prompt_dict_keys", lambda m, e: e.generate([{"text": "hi"}]), "prompts[0]", {"text": "hi"},
     "'prompt_token_ids' or 'prompt'"),
]


@pytest.mark.parametrize("call, field, value, limit", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_engine_input_is_a_config_error(model, llm, call, field, value, limit):
    with pytest.raises(kvcm.ConfigError) as info:
        call(model, llm)
    err = info.value
    assert err.field == field and err.value == value, str(err)
    assert limit in err.limit and str(err).startswith(f"{field}=")


def test_what_vllm_and_transformers_accept_is_accepted(model, llm, tmp_path):
    """A string with a tokenizer, one unwrapped prompt, vLLM's prompt dicts, an id tensor and a dict of
    sampling fields all give the tokens the plain token-id call gives."""
    tok = byte_tokenizer()
    ids = tok.encode("Hello there")
    params = SamplingParams(max_new_tokens=3, ignore_eos=True)
    want = llm.generate([ids], params)[0].token_ids
    with_tok = _mk(model, tokenizer=tok)
    assert with_tok.generate(["Hello there"], params)[0].token_ids == want
    assert with_tok.generate("Hello there", params)[0].token_ids == want
    assert with_tok.generate([{"prompt": "Hello there"}], params)[0].token_ids == want
    assert llm.generate(ids, params)[0].token_ids == want
    assert llm.generate([{"prompt_token_ids": ids}], params)[0].token_ids == want
    assert llm.generate(torch.tensor([ids]), params)[0].token_ids == want
    assert llm.generate([tuple(ids)], {"max_new_tokens": 3, "ignore_eos": True})[0].token_ids == want
    assert llm.generate([]) == []
    assert SamplingParams(stop_strings="ab").stop_strings == ("ab",)  # vLLM's `stop` takes one string
    model.save_pretrained(tmp_path / "m")
    tok.save_pretrained(tmp_path / "m")
    from_dir = LLM(str(tmp_path / "m"), max_batch_size=4, max_seq_len=128)
    assert from_dir.tokenizer is not None
    assert from_dir.generate("Hello there", params)[0].token_ids == want
