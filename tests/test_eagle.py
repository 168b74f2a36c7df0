"""The EAGLE head (explorer/families/eagle/head.py): a drafter that reads the target's final hidden states.

References: the training forward (EAGLE-3's training-time test) against the drafting loop run step
by step; greedy speculative decoding against autoregressive decoding; a chi-square test of tokens 2
and 3 (the first that the head drafts) against a joint enumerated with plain numpy, with a negative
control; file round trip and bad files.
"""

import numpy as np
import pytest
import torch
from references import np_warp

import explorer
from explorer.compact_weights import delta_names
from explorer.decoding import acceptance, speculative
from explorer.decoding.config import DecodeConfig
from explorer.decoding.drafters import available_drafters, make_drafter
from explorer.decoding.events import Proposal, Verification
from explorer.errors import ExplorerError
from explorer.families.eagle import FeatureDrafter, load_eagle_head, save_eagle_head
from explorer.families.random_tiny import build_random_eagle, build_random_llama
from explorer.runtime import Models, Preset
from tests.test_speculative_exact import chi_square_p


@pytest.fixture(scope="module")
def mini():
    return explorer.load_models("random-tiny", device="cpu")


def true_features(target, ids, head):
    """The features the head reads at every position: the final hidden state, after the fused layers' outputs
    (EAGLE-3) for a fused head; hidden_states[l + 1] is layer l's output."""
    out = target.model(input_ids=ids, output_hidden_states=True)
    return torch.cat([*(out.hidden_states[i + 1] for i in head.fuse_layers), out.last_hidden_state], -1)


FUSED = [(), (0,)]  # a plain head and one that mixes decoder layer 0's output into its first step (EAGLE-3)


@pytest.mark.parametrize("fuse", FUSED)
def test_training_forward_matches_the_drafting_loop(mini, fuse):
    """Depth d of ``forward_depths`` at position i is what the drafter computes at its d-th step of a
    chain begun at i - d (true features before, its own predictions after)."""
    head = build_random_eagle(mini.target, seed=7, noise=0.2, fuse_layers=fuse)
    ids = torch.randint(3, 200, (1, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        feats = true_features(mini.target, ids, head)  # (1, 24, feature_size)
        next_ids, feats = ids[:, 1:], feats[:, :-1]
        outs = head.forward_depths(next_ids, feats, 3)
        for start in (0, 4, 11, 19):
            predicted, cache = head.step(next_ids[:, :start + 1], head.fused(feats[:, :start + 1]), 0, None)
            predicted = predicted[:, -1:]
            torch.testing.assert_close(predicted[0, 0], outs[0][0, start], atol=2e-4, rtol=1e-3)
            for d in (1, 2):
                position = start + d
                predicted, cache = head.step(next_ids[:, position:position + 1], predicted, position, cache)
                torch.testing.assert_close(predicted[0, 0], outs[d][0, position], atol=2e-4, rtol=1e-3)


@pytest.mark.parametrize("gamma", [1, 3, 5])
def test_greedy_speculative_with_the_head_equals_autoregressive(mini, gamma):
    prompt = "def fibonacci(n):"
    ar = explorer.decode("autoregressive", mini, prompt, max_new_tokens=40)
    fused = Models(mini.preset, mini.tokenizer, mini.target, None, None, mini.tokenizer, mini.device, mini.dtype,
                   assistant=build_random_eagle(mini.target, seed=4, fuse_layers=(0,)))
    for models in (mini, fused):
        spec = explorer.decode("speculative", models, prompt, max_new_tokens=40, drafter="assistant", gamma=gamma)
        assert spec.token_ids == ar.token_ids
        assert spec.stats["proposed"] > 0
        adaptive = explorer.decode("speculative", models, prompt, max_new_tokens=40, drafter="assistant",
                                   gamma=gamma, adaptive_gamma=True)
        assert adaptive.token_ids == ar.token_ids


def test_the_drafter_keeps_only_verified_features(mini):
    """After a rejection the head's cache and features stop at the last verified position."""
    cfg = DecodeConfig(max_new_tokens=30, gamma=4, drafter="assistant")
    ids = mini.tokenizer("x = [").input_ids
    checks = [e for e in speculative.decode_speculative(mini, ids, cfg) if isinstance(e, Verification)]
    assert any(e.resampled is not None for e in checks), "the test needs a rejection"
    # the head's cache holds only positions whose features the target verified (all but the newest token)
    assert all(e.draft_cache_len <= e.target_cache_len for e in checks)
    assert isinstance(make_drafter(mini, cfg), FeatureDrafter)
    assert "assistant" in available_drafters(mini)
    assert "assistant" not in available_drafters(explorer.load_models("tiny", device="cpu"))


@pytest.mark.parametrize("fuse", FUSED)
def test_each_draft_is_the_heads_chain_from_the_last_verified_feature(mini, fuse):
    """Replaying a greedy decode teacher-forced: every draft the drafter made (up to the first
    rejection) is the argmax of ``forward_depths`` at the chain begun two positions before the
    newest token, over the target's features of the final sequence. A drafter that kept a rejected
    draft's feature, or read one position off, drafts other tokens."""
    cfg = DecodeConfig(max_new_tokens=40, gamma=3, drafter="assistant")
    prompt = mini.tokenizer("for i in range(").input_ids
    head = build_random_eagle(mini.target, seed=9, noise=0.5, fuse_layers=fuse)  # noisy: token and position matter
    models = Models(mini.preset, mini.tokenizer, mini.target, None, None, mini.tokenizer, mini.device, mini.dtype,
                    assistant=head)
    events = list(speculative.decode_speculative(models, prompt, cfg))
    tokens = list(prompt)
    chains = []  # (length when proposed, drafts the target saw up to and including the first rejection)
    for e in events:
        if isinstance(e, Proposal) and e.tokens:
            proposed_at, drafts = len(tokens), e.tokens
        if isinstance(e, Verification):
            if e.checks:
                chains.append((proposed_at, drafts[:e.accepted + 1]))
            tokens += e.emitted
    assert sum(len(c) for _, c in chains) > 10
    ids = torch.tensor([tokens])
    with torch.no_grad():
        feats = true_features(mini.target, ids, head)
        outs = head.forward_depths(ids[:, 1:], feats[:, :-1], cfg.gamma)
    for length, drafts in chains:
        for d, token in enumerate(drafts):
            assert int(head.full_logits(outs[d][0, length - 2 + d]).argmax()) == token


def test_a_proposal_is_the_training_forward_over_its_own_drafts(mini):
    """q of every drafted token equals what ``forward_depths`` gives at that depth when the drafts are
    fed as the next tokens (positions and tokens of the chain line up with training)."""
    head = build_random_eagle(mini.target, seed=9, noise=0.5)
    models = Models(mini.preset, mini.tokenizer, mini.target, None, None, mini.tokenizer, mini.device, mini.dtype,
                    assistant=head)
    tokens = mini.tokenizer("import numpy as np\nx = np.").input_ids
    cfg = DecodeConfig(temperature=1.0, gamma=4, drafter="assistant")
    drafter = make_drafter(models, cfg)
    drafter.propose(tokens[:-3], 4, cfg, torch.Generator())  # arms the capture; nothing to draft yet
    with torch.no_grad():
        mini.target(input_ids=torch.tensor([tokens]))  # the "verify pass": features of every position
    draft = drafter.propose(tokens, 4, cfg, torch.Generator().manual_seed(3))
    assert len(draft.tokens) == 4
    seq = tokens + draft.tokens[:-1]
    with torch.no_grad():
        feats = mini.target.model(input_ids=torch.tensor([seq])).last_hidden_state  # true up to len(tokens) - 2
        outs = head.forward_depths(torch.tensor([seq[1:]]), feats[:, :-1], 4)
    for d, token in enumerate(draft.tokens):
        q = torch.softmax(head.full_logits(outs[d][0, len(tokens) - 2 + d]), -1)
        torch.testing.assert_close(draft.q[d], q, atol=1e-5, rtol=1e-4)
        assert draft.q[d, token] > 0


# ------------------------------------------------------------------------------------------
# exactness with a trimmed head: tokens 2 and 3 (the prefill emits token 1; the head drafts after it)

VOCAB, KEPT, TEMPERATURE, SAMPLES = 8, [0, 2, 5, 7], 0.9, 2400


@pytest.fixture(scope="module", params=FUSED, ids=["plain", "fused"])
def trimmed(request):
    fuse = request.param  # the fused head reads a lower layer too: its target has two
    target = build_random_llama(VOCAB, 16, 1 + len(fuse), seed=24, std=0.6).eval()
    head = build_random_eagle(target, seed=22, noise=0.1, kept=torch.tensor(KEPT), fuse_layers=fuse)
    tok = type("Tok", (), {"eos_token_id": None})()
    return Models(Preset("stat", "random", ""), tok, target, None, None, tok, torch.device("cpu"), torch.float32,
                  assistant=head)


def joint_tokens_2_3(models, prompt):
    """P(x2, x3) = sum over x1 of P(x1) P(x2 | x1) P(x3 | x1, x2) under the target, with numpy warping."""
    def dist(ids):
        with torch.inference_mode():
            return np_warp(models.target(torch.tensor([ids])).logits[0, -1].numpy(), TEMPERATURE)

    joint = np.zeros((VOCAB, VOCAB))
    p1 = dist(prompt)
    for x1 in range(VOCAB):
        p2 = dist(prompt + [x1])
        for x2 in range(VOCAB):
            joint[x2] += p1[x1] * p2[x2] * dist(prompt + [x1, x2])
    return joint


def sample_tokens_2_3(models, prompt, tree=None, lengths=None, **options):
    """x1 is the prefill's own token (the head has no features before it); x2, x3 come from drafts of a chain of
    2, or of a token tree of shape ``tree`` (test_eagle_tree.py). ``lengths`` collects each decode's first draft's
    length."""
    counts, accepted, rejected = np.zeros((VOCAB, VOCAB)), 0, 0
    for seed in range(SAMPLES):
        cfg = DecodeConfig(max_new_tokens=4, temperature=TEMPERATURE, seed=seed, gamma=2, drafter="assistant",
                           tree=tree, **options)
        gen = speculative.decode_speculative(models, prompt, cfg)
        first = lengths is None
        try:
            while True:
                event = next(gen)
                if not first and isinstance(event, Proposal) and event.tokens:
                    lengths.append(len(event.tokens))
                    first = True
                if isinstance(event, Verification):
                    accepted += event.accepted
                    rejected += any(not check.accepted for check in event.checks)
        except StopIteration as stop:
            x2, x3 = stop.value.tokens[1:3]
        counts[x2, x3] += 1
    return counts, accepted, rejected


def test_speculative_sampling_with_a_trimmed_eagle_head_is_exact(trimmed):
    prompt = [1, 2, 3]
    joint = joint_tokens_2_3(trimmed, prompt)
    outside = [i for i in range(VOCAB) if i not in KEPT]
    assert min(joint[outside].sum(), joint[:, outside].sum()) > 0.1, "needs mass the head cannot propose"
    counts, accepted, rejected = sample_tokens_2_3(trimmed, prompt)
    assert accepted > SAMPLES / 4 and rejected > SAMPLES / 4, "both rules must be exercised"
    assert chi_square_p(counts, joint) > 1e-3


def test_an_eagle_draft_cut_by_its_confidence_keeps_sampling_exact(trimmed):
    """The head's chain ends once the draft's probability under the head falls below ``draft_confidence``."""
    prompt, lengths = [1, 2, 3], []
    cut = 0.65 if trimmed.assistant.fuse_layers else 0.9  # the plain random head is the surer one
    counts = sample_tokens_2_3(trimmed, prompt, lengths=lengths, draft_confidence=cut)[0]
    assert 0.2 < lengths.count(1) / len(lengths) < 0.8, "the cut must happen on some drafts and not on others"
    assert chi_square_p(counts, joint_tokens_2_3(trimmed, prompt)) > 1e-3


def test_negative_control_accepting_every_draft_fails(trimmed, monkeypatch):
    """Keeping every drafted token (no rejection) gives the head's distribution, not the target's."""
    monkeypatch.setattr(acceptance, "acceptance_probability", lambda p, q: 1.0)
    prompt = [1, 2, 3]
    assert chi_square_p(sample_tokens_2_3(trimmed, prompt)[0], joint_tokens_2_3(trimmed, prompt)) < 1e-3


# ------------------------------------------------------------------------------------------
# files

def test_round_trip_and_bad_files(mini, tmp_path):
    save_eagle_head(mini.assistant, tmp_path / "eagle", dtype=torch.float32)
    loaded = load_eagle_head(tmp_path / "eagle", mini.target, torch.float32)
    assert loaded.shared["embed"] is mini.target.get_input_embeddings().weight  # shared, not stored
    ids, feats = torch.tensor([[5, 6, 7]]), torch.randn(1, 3, mini.target.config.hidden_size)
    with torch.no_grad():
        torch.testing.assert_close(loaded.step(ids, feats, 0, None)[0], mini.assistant.step(ids, feats, 0, None)[0])
    sizes = Models(mini.preset, mini.tokenizer, mini.target, None, None, mini.tokenizer, mini.device, mini.dtype,
                   assistant=loaded).memory_bytes()
    assert sizes["assistant"] == loaded.head_bytes() > 0
    (tmp_path / "eagle" / "model.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(ExplorerError, match=r"draft file is corrupt: .*model\.safetensors"):
        load_eagle_head(tmp_path / "eagle", mini.target, torch.float32)
    (tmp_path / "eagle" / "config.json").unlink()
    with pytest.raises(ExplorerError, match=r"draft file missing: .*config\.json"):
        load_eagle_head(tmp_path / "eagle", mini.target, torch.float32)


def test_layer_matrices_near_the_target_are_stored_as_differences_from_its_last_layer(mini, tmp_path):
    """The head's layer starts as the target's last layer: the matrices that stay near it are stored as int4
    differences from it (fewer bytes); loaded next to the target the head computes what it did."""
    head = build_random_eagle(mini.target, seed=3, noise=0.01)
    save_eagle_head(head, tmp_path / "eagle", target=mini.target)
    names = delta_names(tmp_path / "eagle" / "model.safetensors")
    # o and down start scaled by 0.1 (build_eagle_head): far from the target's, stored as themselves
    assert names == sorted(f"layer.{p}.weight" for p in ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj"))
    loaded = load_eagle_head(tmp_path / "eagle", mini.target, torch.float32)
    save_eagle_head(head, tmp_path / "int8", target=None)  # every matrix as int8 rows of itself
    int8 = load_eagle_head(tmp_path / "int8", mini.target, torch.float32)
    ids, feats = torch.tensor([[5, 6, 7]]), torch.randn(1, 3, mini.target.config.hidden_size)
    with torch.no_grad():
        want = head.step(ids, feats, 0, None)[0]
        err = (loaded.step(ids, feats, 0, None)[0] - want).abs().max()
        assert err <= 1.5 * (int8.step(ids, feats, 0, None)[0] - want).abs().max()  # no worse than int8 rows
        for name in names:
            torch.testing.assert_close(loaded.state_dict()[name], head.state_dict()[name], atol=5e-3, rtol=0)
    # negative control: beside another target the same file is another head
    other = build_random_llama(mini.target.config.vocab_size, mini.target.config.hidden_size,
                               mini.target.config.num_hidden_layers, seed=5, std=0.3)
    wrong = load_eagle_head(tmp_path / "eagle", other, torch.float32)
    assert (wrong.state_dict()[names[0]] - head.state_dict()[names[0]]).abs().max() > 0.05


def decode_side_by_side(models, prompt: str, drafter: str, n: int = 40) -> dict:
    """AR and speculative decodes of one prompt on the same models in two threads at once (as the app's lanes)."""
    import threading

    out, errors = {}, []

    def run(method, **options):
        try:
            out[method] = explorer.decode(method, models, prompt, max_new_tokens=n, **options).token_ids
        except Exception as exc:  # noqa: BLE001 - reported by the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=("autoregressive",)),
               threading.Thread(target=run, args=("speculative",), kwargs={"drafter": drafter, "gamma": 3})]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    return out


def test_a_decode_beside_it_on_the_same_target_does_not_feed_the_head(mini):
    """The head's hook captures only its own thread's verify pass: an AR lane decoded at the same time on the
    same target must neither fill it with its hidden states nor disarm it."""
    ar = explorer.decode("autoregressive", mini, "def fibonacci(n):", max_new_tokens=40).token_ids
    for _ in range(3):
        both = decode_side_by_side(mini, "def fibonacci(n):", "assistant")
        assert both["autoregressive"] == ar and both["speculative"] == ar


@pytest.mark.parametrize("precision", ["bfloat16-weights", "int8"])
def test_a_fused_head_keeps_greedy_speculative_exact_on_the_row_invariant_kernels(mini, precision):
    """The exact precisions put the head's linears, its fusion included, on the kernels and capture the fused
    layers' outputs from the converted target (its lean decoder layers)."""
    from explorer.precision import converted_copy

    fused = Models(mini.preset, mini.tokenizer, mini.target, None, None, mini.tokenizer, mini.device, mini.dtype,
                   assistant=build_random_eagle(mini.target, seed=4, fuse_layers=(0,)))
    models = converted_copy(fused, precision)
    assert type(models.assistant.fuse).__name__ == "RowInvariantLinear"
    for prompt in ("def fibonacci(n):", "x = [1, 2"):
        ar = explorer.decode("autoregressive", models, prompt, max_new_tokens=32)
        spec = explorer.decode("speculative", models, prompt, max_new_tokens=32, drafter="assistant", gamma=3)
        assert spec.token_ids == ar.token_ids and spec.stats["proposed"] > 0
