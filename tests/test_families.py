"""The hub presets' architectures, as random miniatures where transformers has them.

Qwen2 (the qwen2.5-7b preset's target and draft) is in transformers: a miniature target and draft built
from Qwen2Config decode greedy-equal to autoregressive decoding and to ``generate``. Dream (qwen2.5-7b's
diffusion model) and LLaDA (smollm2-1.7b's) are not in transformers: they run only as allowlisted remote
code from the Hub, so no miniature of them can be built offline (SmolLM2 is a Llama: random-tiny covers it).
"""

import pytest
import torch
import transformers

import explorer
from explorer.runtime import Models, Preset, build_byte_tokenizer


@pytest.fixture(scope="module")
def qwen2():
    tokenizer = build_byte_tokenizer()

    def build(seed, hidden, layers):
        torch.manual_seed(seed)
        config = transformers.Qwen2Config(vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=2 * hidden,
                                          num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                                          max_position_embeddings=256, initializer_range=0.1,
                                          eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
        return transformers.Qwen2ForCausalLM(config).eval()

    target, draft = build(1, 64, 2), build(2, 32, 1)
    preset = Preset("random-qwen2", "random", "Qwen2 miniatures (test only)")
    return Models(preset, tokenizer, target, draft, None, tokenizer, torch.device("cpu"), torch.float32)


@pytest.mark.parametrize("prompt", ["def parse(line):", "The quick brown fox"])
def test_qwen2_miniature_speculative_equals_autoregressive_and_generate(qwen2, prompt):
    ar = explorer.decode("autoregressive", qwen2, prompt, max_new_tokens=16)
    spec = explorer.decode("speculative", qwen2, prompt, max_new_tokens=16, drafter="model", gamma=3)
    ids = torch.tensor([qwen2.tokenizer(prompt).input_ids])
    hf = qwen2.target.generate(ids, max_new_tokens=16, do_sample=False)[0, ids.shape[1]:].tolist()
    eos = qwen2.tokenizer.eos_token_id
    hf = hf[: hf.index(eos) + 1] if eos in hf else hf
    assert spec.token_ids == ar.token_ids == hf


def test_dream_and_llada_are_not_in_transformers():
    assert not any(name.lower().startswith(("dream", "llada")) for name in dir(transformers))
