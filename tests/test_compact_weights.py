"""Compact weights (int8 rows, int4 groups) round trip, the loaders read every form, the tracked tree stays small."""

import subprocess
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from explorer.compact_weights import (
    FORMAT,
    FORMAT4,
    SCALE,
    SCALE4,
    compact_format,
    compact_state,
    delta_names,
    dequantize_groups,
    from_pretrained,
    is_compact,
    load_weights,
    quantize_groups,
    save_compact,
)
from explorer.errors import ExplorerError

ROOT = Path(__file__).resolve().parents[1]
TREE_LIMIT = 40 * 2**20


def sample_state() -> dict:
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(64, 128, generator=gen)
    w[3] *= 100  # rows of very different scales keep their own steps
    w[5] = 0  # an all-zero row
    return {"w": w, "w16": torch.randn(96, 64, generator=gen).half(),
            "norm": 1 + 0.01 * torch.randn(128, generator=gen), "small": torch.randn(8, 8, generator=gen),
            "huge": torch.tensor([1e6, -2.0]),
            "ids": torch.tensor([3, 1, 4, 1 << 40], dtype=torch.long), "flags": torch.tensor([1, 0], dtype=torch.int32)}


def test_round_trip_error_within_half_a_step_per_row(tmp_path):
    state = sample_state()
    save_compact(state, tmp_path / "m.safetensors")
    back = load_weights(tmp_path / "m.safetensors")
    assert set(back) == set(state)
    for name in ("w", "w16"):
        w = state[name].float()
        step = w.abs().amax(dim=1, keepdim=True) / 127
        assert back[name].dtype == torch.float32 and back[name].shape == w.shape
        assert ((back[name] - w).abs() <= step / 2 + 1e-6 * step).all()  # the rounding's bound, row by row
        assert (back[name] - w).abs().max() > 0  # quantized indeed
    assert torch.equal(back["w"][5], torch.zeros(128))
    stored = load_file(str(tmp_path / "m.safetensors"))
    assert stored["w"].dtype == torch.int8 and stored["w" + SCALE].dtype == torch.float32
    assert stored["w" + SCALE].shape == (64, 1)
    # small and 1-D tensors: float16 (to its precision); one float16 cannot hold stays float32
    assert stored["norm"].dtype == stored["small"].dtype == torch.float16
    torch.testing.assert_close(back["norm"], state["norm"], rtol=1e-3, atol=0)
    assert stored["huge"].dtype == torch.float32 and torch.equal(back["huge"], state["huge"])


def test_integer_tensors_untouched(tmp_path):
    state = sample_state()
    save_compact(state, tmp_path / "m.safetensors")
    back = load_weights(tmp_path / "m.safetensors")
    for name in ("ids", "flags"):
        assert back[name].dtype == state[name].dtype and torch.equal(back[name], state[name])


def test_marker_and_plain_file_not_taken_for_compact(tmp_path):
    state = sample_state()
    save_compact(state, tmp_path / "c.safetensors")
    assert is_compact(tmp_path / "c.safetensors")
    from safetensors import safe_open

    with safe_open(str(tmp_path / "c.safetensors"), framework="pt") as f:
        assert f.metadata() == {"format": FORMAT}
    # negative controls: a plain file (with or without transformers' own marker) loads as stored
    for meta in (None, {"format": "pt"}):
        save_file({k: v.contiguous() for k, v in state.items()}, str(tmp_path / "p.safetensors"), metadata=meta)
        assert not is_compact(tmp_path / "p.safetensors")
        back = load_weights(tmp_path / "p.safetensors")
        assert all(torch.equal(back[k], v) for k, v in state.items())
    # a plain file that happens to hold int8 tensors and names ending like scales is not dequantized either
    odd = compact_state(state)
    save_file(odd, str(tmp_path / "odd.safetensors"))
    assert load_weights(tmp_path / "odd.safetensors")["w"].dtype == torch.int8


@pytest.mark.parametrize("group", [32, 64])
def test_int4_round_trip_error_within_half_a_step_per_group(tmp_path, group):
    state = sample_state()
    state["w"][7, :group] *= 1000  # one loud group does not coarsen the rest of its row
    save_compact(state, tmp_path / "m.safetensors", bits=4, group=group)
    back = load_weights(tmp_path / "m.safetensors")
    stored = load_file(str(tmp_path / "m.safetensors"))
    assert set(back) == set(state)
    for name in ("w", "w16"):
        w = state[name].float()
        rows, cols = w.shape
        packed, scale = stored[name], stored[name + SCALE4]
        assert packed.dtype == torch.uint8 and packed.shape == (rows, cols // 2)
        assert scale.dtype == torch.float16 and scale.shape == (rows, cols // group)
        step = scale.float().repeat_interleave(group, dim=1)  # each element's own group step
        assert back[name].dtype == torch.float32 and back[name].shape == w.shape
        assert ((back[name] - w).abs() <= step / 2 + 1e-6 * step).all()
        assert (back[name] - w).abs().max() > 0
        # the scale is the group's absmax / 7 (float16, never rounded down: nothing clips)
        exact = w.reshape(rows, -1, group).abs().amax(dim=2) / 7
        assert (scale.float() >= exact).all() and (scale.float() <= exact * (1 + 2**-10)).all()
    assert (stored["w" + SCALE4][7, 0] > 100 * stored["w" + SCALE4][7, 1:]).all()
    assert torch.equal(back["w"][5], torch.zeros(128))
    assert stored["norm"].dtype == stored["small"].dtype == torch.float16  # small and 1-D: float16 as in int8 files
    assert stored["huge"].dtype == torch.float32 and torch.equal(back["huge"], state["huge"])
    for name in ("ids", "flags"):
        assert torch.equal(back[name], state[name])


def test_int4_packing_nibbles_and_negative_values():
    """Symmetric -7..7 stored as q + 8: element 2j in the low nibble, 2j + 1 in the high one; -8 never occurs."""
    q = torch.tensor([-7, 7, 0, -1, 3, -4, 6, -6] * 4, dtype=torch.float32)  # one group of 32, absmax 7
    w = (q * 0.5).unsqueeze(0)  # scale 0.5 exactly (float16 holds it)
    packed, scale = quantize_groups(w, 32)
    assert scale.tolist() == [[0.5]]
    expected = [(a + 8) | ((b + 8) << 4) for a, b in zip(q[0::2].int().tolist(), q[1::2].int().tolist(), strict=True)]
    assert packed[0].tolist() == expected
    assert packed[0, 0].item() == 1 | (15 << 4)  # -7 low (1), +7 high (15)
    assert packed[0, 1].item() == 8 | (7 << 4)  # 0 low (8), -1 high (7)
    nibbles = torch.cat([packed & 0xF, packed >> 4])
    assert nibbles.min() >= 1 and nibbles.max() <= 15
    assert torch.equal(dequantize_groups(packed, scale), w)  # exact grid points come back exactly
    # off the grid: the absmax maps to 7 steps (the float16 scale rounded up, so 1.0 comes back a hair above),
    # -0.3 to the nearest step, -2
    packed, scale = quantize_groups(torch.tensor([[1.0, -0.3] + [0.0] * 30]), 32)
    s = scale.float().item()
    assert s >= 1 / 7 and packed[0, 0].item() == 15 | (6 << 4)
    assert torch.equal(dequantize_groups(packed, scale)[0, :2], torch.tensor([7 * s, -2 * s]))
    with pytest.raises(ValueError, match="multiple"):
        quantize_groups(torch.randn(4, 48), 32)


def test_int4_marker_fallback_and_negative_control(tmp_path):
    state = sample_state()
    state["odd_rows"] = torch.randn(64, 72)  # 72 is not a multiple of 32: int8 rows in the same file
    save_compact(state, tmp_path / "c.safetensors", bits=4, group=32)
    assert is_compact(tmp_path / "c.safetensors") and compact_format(tmp_path / "c.safetensors") == FORMAT4
    from safetensors import safe_open

    with safe_open(str(tmp_path / "c.safetensors"), framework="pt") as f:
        assert f.metadata() == {"format": FORMAT4, "group": "32"}
    stored = load_file(str(tmp_path / "c.safetensors"))
    assert stored["odd_rows"].dtype == torch.int8 and "odd_rows" + SCALE in stored
    back = load_weights(tmp_path / "c.safetensors")
    step = state["odd_rows"].abs().amax(dim=1, keepdim=True) / 127
    assert ((back["odd_rows"] - state["odd_rows"]).abs() <= step / 2 + 1e-6 * step).all()
    save_compact(state, tmp_path / "c8.safetensors")
    assert compact_format(tmp_path / "c8.safetensors") == FORMAT
    # negative control: the same tensors without the marker are a plain file, loaded as stored (uint8 kept)
    save_file(compact_state(state, bits=4), str(tmp_path / "odd.safetensors"))
    assert compact_format(tmp_path / "odd.safetensors") is None
    plain = load_weights(tmp_path / "odd.safetensors")
    assert plain["w"].dtype == torch.uint8 and "w" + SCALE4 in plain
    # an unknown format name is not taken for compact either
    save_file({"w": state["w"]}, str(tmp_path / "other.safetensors"), metadata={"format": "explorer-int3"})
    assert not is_compact(tmp_path / "other.safetensors")
    with pytest.raises(ValueError, match="bits"):
        compact_state(state, bits=2)


def test_tied_llama_loads_from_a_compact_folder(tmp_path):
    from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).eval()
    model.save_pretrained(tmp_path / "plain")
    model.config.save_pretrained(tmp_path / "compact")
    save_compact({k: v for k, v in model.state_dict().items() if k != "lm_head.weight"},
                 tmp_path / "compact" / "model.safetensors")
    plain = from_pretrained(AutoModelForCausalLM, tmp_path / "plain")
    compact = from_pretrained(AutoModelForCausalLM, tmp_path / "compact", torch.bfloat16)
    assert compact.dtype == torch.bfloat16
    compact = compact.float()
    assert compact.lm_head.weight is compact.model.embed_tokens.weight  # tied again
    ids = torch.tensor([[5, 17, 250, 3, 99]])
    with torch.no_grad():
        a, b, c = model(ids).logits, plain(ids).logits, compact(ids).logits
    assert torch.equal(a, b)
    assert (a - c).abs().max() < 0.05 * a.abs().max() and not torch.equal(a, c)
    (tmp_path / "compact" / "config.json").write_text((tmp_path / "compact" / "config.json").read_text()
                                                      .replace('"num_hidden_layers": 2', '"num_hidden_layers": 3'))
    with pytest.raises(ValueError, match="does not match"):
        from_pretrained(AutoModelForCausalLM, tmp_path / "compact")


def test_differences_from_a_reference_round_trip_closer_than_int8_rows(tmp_path):
    """A fine-tuned copy stored as int4 differences from its reference: fewer bytes than int8 rows, and closer
    to the weights, because the error is a share of the (small) difference, not of the weight."""
    gen = torch.Generator().manual_seed(1)
    ref = torch.randn(64, 128, generator=gen)
    w = ref + 0.05 * torch.randn(64, 128, generator=gen)  # a copy moved by training
    state = {"w": w, "norm": torch.ones(128), "ids": torch.tensor([2, 5])}
    save_compact(state, tmp_path / "d.safetensors", bits=4, reference={"w": ref})
    save_compact(state, tmp_path / "i8.safetensors")
    assert delta_names(tmp_path / "d.safetensors") == ["w"] and delta_names(tmp_path / "i8.safetensors") == []
    seen = []
    back = load_weights(tmp_path / "d.safetensors", lambda name, st: seen.append((name, st["ids"].tolist())) or ref)
    assert seen == [("w", [2, 5])]  # the reference is asked by name and sees the file's other tensors
    d8 = load_weights(tmp_path / "i8.safetensors")["w"] - w
    assert 0 < (back["w"] - w).abs().max() < d8.abs().max()
    assert (back["w"] - w).pow(2).mean() < d8.pow(2).mean()
    assert (tmp_path / "d.safetensors").stat().st_size < 0.7 * (tmp_path / "i8.safetensors").stat().st_size
    # negative control: the same bytes read as a plain int4 file (no reference added) are far off
    assert (dequantize_groups(*[load_file(str(tmp_path / "d.safetensors"))[k] for k in ("w", "w" + SCALE4)])
            - w).abs().max() > 1


def test_differences_without_their_reference_are_one_clear_error(tmp_path):
    ref = torch.randn(16, 64)
    save_compact({"w": ref + 0.01}, tmp_path / "d.safetensors", bits=4, reference={"w": ref})
    with pytest.raises(ExplorerError, match="stores differences from another model's weights"):
        load_weights(tmp_path / "d.safetensors")
    with pytest.raises(ExplorerError, match=r"no reference of shape \(16, 64\) for w"):
        load_weights(tmp_path / "d.safetensors", lambda name, st: torch.zeros(8, 64))
    with pytest.raises(ValueError, match="reference for w"):
        save_compact({"w": ref}, tmp_path / "e.safetensors", bits=4, reference={"w": torch.zeros(3)})


def tracked_sizes() -> list[tuple[int, str]]:
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    paths = [p for p in out.decode().split("\0") if p]
    if not paths:
        pytest.skip("not a git checkout")
    return sorted(((ROOT / p).stat().st_size, p) for p in paths if (ROOT / p).is_file())


# Issue 26's budget: the tree that travels to a GPU machine (64 MiB a call) with room beside it for the wheels and
# chunks of the 98 MB GGUF. Measured: 37.1 MiB, with the SmolLM2 draft and the EAGLE head's near-target matrices
# stored as int4 differences from the target, the LoRA factors in int4 groups of 16, palette screenshots, and the
# distillation shards in the history instead of the tree (data/smollm2-distill/README.md).
def test_tracked_tree_stays_under_its_budget():
    sizes = tracked_sizes()
    total = sum(s for s, _ in sizes)
    largest = "\n".join(f"  {s / 2**20:7.2f} MiB  {p}" for s, p in sizes[::-1][:10])
    assert total <= TREE_LIMIT, (f"the tracked tree is {total / 2**20:.1f} MiB (budget {TREE_LIMIT / 2**20:.0f} "
                                 f"MiB); largest:\n{largest}")


def test_tree_size_check_sees_the_weights():
    """Negative control for the size test: the listing holds the model files (it would pass on an empty list)."""
    paths = [p for _, p in tracked_sizes()]
    assert "assets/models/tiny/target/model.safetensors" in paths
