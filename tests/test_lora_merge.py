"""The diffusion adapter's LoRA is merged without peft (its import costs seconds at every load): the same bits as
peft's own merge_and_unload, and a variant the merge does not state is refused."""

import copy

import pytest
import torch
from peft import LoraConfig, get_peft_model, get_peft_model_state_dict

from explorer.families.random_tiny import build_random_llama
from explorer.families.smollm2.diffusion_adapter import merge_lora


def lora_pair(seed=0):
    base = build_random_llama(64, 32, 2, seed=seed)
    config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"], init_lora_weights=False)
    peft = get_peft_model(copy.deepcopy(base), config)
    return base, peft, config


def test_the_merge_gives_peft_merge_and_unload_bits():
    base, peft, config = lora_pair()
    weights = {k: v.clone() for k, v in get_peft_model_state_dict(peft).items()}
    mine = copy.deepcopy(base)
    merge_lora(mine, config.to_dict() | {"peft_type": "LORA", "target_modules": sorted(config.target_modules)},
               weights)
    ref = peft.merge_and_unload()
    a, b = mine.state_dict(), ref.state_dict()
    assert set(a) == set(b)
    changed = [k for k in a if not torch.equal(a[k], base.state_dict()[k])]
    assert len(changed) == 2 * 3  # q, v and down in each of 2 layers
    assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("bad", ["dora", "missing", "stray"])
def test_what_the_merge_does_not_state_is_refused(bad):
    base, peft, config = lora_pair()
    weights = dict(get_peft_model_state_dict(peft))
    cfg = config.to_dict() | {"peft_type": "LORA", "target_modules": sorted(config.target_modules)}
    if bad == "dora":
        cfg["use_dora"] = True
    elif bad == "missing":
        weights = {k: v for k, v in weights.items() if "layers.1.self_attn.q_proj" not in k}
    else:
        weights["base_model.model.model.layers.0.self_attn.q_proj.magnitude"] = torch.ones(1)
    with pytest.raises(KeyError):
        merge_lora(copy.deepcopy(base), cfg, weights)
