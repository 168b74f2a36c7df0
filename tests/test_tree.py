"""Token trees against references: greedy autoregressive decoding, a brute-force mask, fresh prefills, the exact
two-token distribution (chi-square, with a negative control that must fail), and bad input."""

import subprocess
import sys

import numpy as np
import pytest
import torch
from test_speculative_exact import PROMPTS, VOCAB, chi_square_p, exact_two_token_distribution, small_vocab_models  # noqa: F401
from transformers import DynamicCache

import explorer
from explorer.decoding import speculative_tree, tree
from explorer.decoding.config import DecodeConfig, parse_tree
from explorer.decoding.events import Proposal, Verification
from explorer.errors import ExplorerError

SHAPES = ["3,2,1", "dynamic:16", "1,1,1,1", "4", "2,2,2,2"]


@pytest.fixture(scope="module")
def tiny_models():
    return explorer.load_models("tiny", device="cpu")


@pytest.mark.parametrize("drafter", ["model", "early_exit"])
@pytest.mark.parametrize("preset", ["tiny", "random"])
def test_greedy_tree_equals_autoregressive(tiny_models, random_models, preset, drafter):
    models = tiny_models if preset == "tiny" else random_models
    prompts = ["def parse(line):", "import os\n", "class A:\n    def"] if preset == "tiny" else PROMPTS[:4]
    later_sibling_accepted = 0
    for prompt in prompts:
        ar = explorer.decode("autoregressive", models, prompt, max_new_tokens=24)
        for shape in SHAPES:
            trace = explorer.decode("speculative", models, prompt, max_new_tokens=24, tree=shape, drafter=drafter,
                                    early_exit_layers=1 if preset == "random" else None)
            assert trace.token_ids == ar.token_ids, (prompt, shape)
            assert trace.stats["tree"] == shape
            for e in trace.events:
                if isinstance(e, Verification):  # a child other than the draft's top-1 was the target's choice
                    later_sibling_accepted += sum(c.accepted and c.node is not None and c.node > 0 and
                                                  any(not d.accepted and d.position == c.position for d in e.checks)
                                                  for c in e.checks)
    assert later_sibling_accepted > 0, "no step ever used a sibling: the tree never mattered"


def _paths(parents):
    """Each node's path from the root (its ancestors' indices and itself), built independently."""
    paths = []
    for i, parent in enumerate(parents):
        paths.append((paths[parent] if parent >= 0 else ()) + (i,))
    return paths


@pytest.mark.parametrize("parents", [[-1, -1, -1, 0, 0, 1, 3], [-1, 0, 1, 2], [-1, -1, 1, 1, 3, 2, 5, -1]])
def test_mask_and_positions_match_a_brute_force_construction(parents):
    past, fed = 5, 2
    mask, positions = tree.verify_inputs(parents, past, fed, torch.float32, torch.device("cpu"))
    paths = _paths(parents)
    n = len(parents)
    expected = np.zeros((fed + n, past + fed + n), dtype=bool)
    for row in range(fed + n):
        for col in range(past + fed + n):
            if row < fed:
                expected[row, col] = col <= past + row
            else:
                node = row - fed
                expected[row, col] = col < past + fed or (col - past - fed) in paths[node]
    assert np.array_equal(mask[0, 0].numpy() == 0, expected)
    assert positions[0].tolist() == list(range(past, past + fed)) + [past + fed - 1 + len(p) for p in paths]


def test_tree_pass_logits_equal_a_plain_forward_of_each_path(random_models):
    """The verify pass over a tree gives every node the logits of prefix + its path run alone."""
    model = random_models.target
    prefix = [5, 17, 3, 40, 11]
    parents, tokens = [-1, -1, 0, 0, 2, 1], [7, 8, 9, 10, 11, 12]
    cache = DynamicCache()
    with torch.inference_mode():
        model(input_ids=torch.tensor([prefix[:3]]), past_key_values=cache, use_cache=True)
        mask, positions = tree.verify_inputs(parents, 3, 2, torch.float32, torch.device("cpu"))
        out = model(input_ids=torch.tensor([prefix[3:] + tokens]), past_key_values=cache, use_cache=True,
                    attention_mask=mask, position_ids=positions).logits[0]
        for node, path in enumerate(_paths(parents)):
            plain = model(input_ids=torch.tensor([prefix + [tokens[i] for i in path]])).logits[0, -1]
            torch.testing.assert_close(out[2 + node], plain, rtol=1e-4, atol=1e-4)
        # compaction: keep the prefix and the path to node 4, then one more token sees exactly that sequence
        path = list(_paths(parents)[4])
        tree.select_cache(cache, list(range(5)) + [5 + i for i in path])
        assert cache.get_seq_length() == 5 + len(path)
        after = model(input_ids=torch.tensor([[21]]), past_key_values=cache, use_cache=True).logits[0, -1]
        fresh = model(input_ids=torch.tensor([prefix + [tokens[i] for i in path] + [21]])).logits[0, -1]
        torch.testing.assert_close(after, fresh, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("shape", ["3,2,1", "dynamic:9"])
def test_drafter_cache_after_rollback_equals_a_fresh_prefill(random_models, shape):
    drafter = speculative_tree.TreeDrafter(random_models.draft, None)
    cfg = DecodeConfig(temperature=0.8, seed=1)
    gen = torch.Generator().manual_seed(1)
    tokens = [5, 17, 3, 40, 11, 9]
    for _ in range(3):
        t = drafter.propose_tree(tokens, parse_tree(shape), 8, cfg, gen)
        deepest = max(range(len(t)), key=lambda i: (t.depths()[i], -i))
        path = list(_paths(t.parents)[deepest])
        drafter.rollback_tree(len(tokens), path)
        kept = drafter.cache_len - len(tokens)
        assert 1 <= kept < len(path) + 1  # the fed nodes of the path: all but the unfed leaf
        tokens = tokens + [t.tokens[i] for i in path[:kept]]
        fresh = DynamicCache()
        with torch.inference_mode():
            random_models.draft(input_ids=torch.tensor([tokens]), past_key_values=fresh, use_cache=True)
        for mine, ref in zip(drafter.cache.layers, fresh.layers, strict=True):
            torch.testing.assert_close(mine.keys, ref.keys, rtol=1e-4, atol=1e-4)
            torch.testing.assert_close(mine.values, ref.values, rtol=1e-4, atol=1e-4)
        tokens.append(3)  # the target's own token, which the draft has not seen


def test_events_carry_the_tree_and_caches_hold_the_kept_tokens(random_models):
    prompt = "def parse(line):"
    n_prompt = len(random_models.tokenizer(prompt).input_ids)
    for shape in ["3,2,1", "dynamic:16"]:
        trace = explorer.decode("speculative", random_models, prompt, max_new_tokens=30, tree=shape, temperature=0.8,
                                seed=4)
        emitted, proposal = 0, None
        for e in trace.events:
            if isinstance(e, Proposal):
                proposal = e
                assert len(e.parents) == len(e.tokens) == len(e.q)
                assert all(-1 <= p < i for i, p in enumerate(e.parents))
            if isinstance(e, Verification):
                path = list(e.path)
                assert [proposal.parents[i] for i in path] == ([-1] + path)[:len(path)]  # a path from the root
                assert list(e.emitted[:len(path)]) == [proposal.tokens[i] for i in path][:len(e.emitted)]
                assert e.accepted == len(path) == sum(c.accepted for c in e.checks)
                emitted += len(e.emitted)
                assert e.target_cache_len == n_prompt + emitted - 1
                assert e.draft_cache_len <= n_prompt + emitted - 1
        assert emitted == trace.stats["new_tokens"] == len(trace.token_ids) == 30
        assert trace.stats["tokens_per_target_pass"] > 1


# ------------------------------------------------------------------------------------------
# statistical exactness at T = 0.7 (top-k 4 of a vocabulary of 8, as test_speculative_exact)

SAMPLES = 3000


def sample_two_tokens_tree(models, prompt_ids, shape, samples=SAMPLES):
    counts = np.zeros((VOCAB, VOCAB))
    for seed in range(samples):
        cfg = DecodeConfig(max_new_tokens=3, temperature=0.7, top_k=4, seed=seed, tree=shape)
        gen = speculative_tree.decode_speculative_tree(models, prompt_ids, cfg)
        try:
            while True:
                next(gen)
        except StopIteration as stop:
            x1, x2 = stop.value.tokens[:2]
        counts[x1, x2] += 1
    return counts


@pytest.mark.parametrize("shape", ["3,2", "dynamic:6"])
def test_tree_sampling_matches_exact_target_distribution(small_vocab_models, shape):  # noqa: F811
    joint = exact_two_token_distribution(small_vocab_models, [1, 2, 3])
    counts = sample_two_tokens_tree(small_vocab_models, [1, 2, 3], shape)
    assert chi_square_p(counts, joint) > 1e-3


def test_negative_control_siblings_without_the_residual_fail(small_vocab_models, monkeypatch):  # noqa: F811
    """Trying the next sibling against p instead of norm(max(0, p - q)) is biased: the same test must see it."""
    monkeypatch.setattr(tree, "residual_distribution", lambda p, q: p)
    joint = exact_two_token_distribution(small_vocab_models, [1, 2, 3])
    counts = sample_two_tokens_tree(small_vocab_models, [1, 2, 3], "3,2")
    assert chi_square_p(counts, joint) < 1e-3


# ------------------------------------------------------------------------------------------
# bad input: one line each

@pytest.mark.parametrize("options, words", [
    ({"tree": "3,x"}, "not a shape"), ({"tree": "0,2"}, "not a shape"), ({"tree": "dynamic:0"}, "node budget"),
    ({"tree": "dynamic:abc"}, "node budget"), ({"tree": 5}, "must be text"), ({"tree": "9,9,9"}, "at most"),
    ({"tree": "3,2,1", "drafter": "prompt_lookup"}, "cannot branch"),
    ({"tree": "3,2,1", "drafter": "diffusion"}, "cannot branch"),
    ({"tree": "3,2,1", "adaptive_gamma": True}, "own shape"),
    ({"tree": "dynamic:64", "max_new_tokens": 460}, "exceed the model's context"),
])
def test_bad_tree_input_gives_one_line(random_models, options, words):
    with pytest.raises(ExplorerError) as info:
        explorer.decode("speculative", random_models, "def parse(line):", **options)
    assert words in str(info.value) and "\n" not in str(info.value)


def test_a_target_with_sliding_window_layers_is_refused_in_one_line():
    models = explorer.load_models("random-gemma4", device="cpu")
    with pytest.raises(ExplorerError, match="sliding-window attention") as info:
        explorer.decode("speculative", models, "hello", tree="3,2", drafter="early_exit", max_new_tokens=4)
    assert "\n" not in str(info.value)


def test_cli_bad_tree_exits_2_with_one_line():
    run = subprocess.run([sys.executable, "-m", "explorer", "decode", "--preset", "random-tiny", "--method",
                          "speculative", "--tree", "3,,1", "--prompt", "x"], capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 2, run.stderr
    lines = [ln for ln in run.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "not a shape" in lines[0], run.stderr


# ------------------------------------------------------------------------------------------
# the lane: the latest step's tree, states per node, narration

def test_the_lane_draws_the_latest_tree_with_path_rejections_and_unchecked_nodes():
    import re

    from explorer.app import narration, render, tree_view
    from explorer.decoding.events import DraftCheck

    # root children a, b, c; b has children d, e; c has child f. The target refuses a, accepts b, then refuses
    # d and e and draws z from the residual: kept b z; c and f are never checked.
    parents = (-1, -1, -1, 1, 1, 2)
    proposal = Proposal(t=0, step=0, drafter="model", gamma=2, tokens=(1, 2, 3, 4, 5, 6),
                        q=(0.5, 0.3, 0.1, 0.6, 0.2, 0.9), forward_s=0, draft_passes=2, parents=parents)
    checks = (DraftCheck(0, 1, 0.1, 0.5, 0.2, False, node=0), DraftCheck(0, 2, 0.4, 0.3, 1.0, True, node=1),
              DraftCheck(1, 4, 0.0, 0.6, 0.0, False, node=3), DraftCheck(1, 5, 0.1, 0.2, 0.5, False, node=4))
    ver = Verification(t=1, step=0, checks=checks, accepted=1, resampled=26, bonus=None, emitted=(2, 26),
                       forward_s=0, target_cache_len=5, draft_cache_len=5, next_gamma=4, path=(1,))
    piece = "_abcdefghijklmnopqrstuvwxyz".__getitem__
    view = render.LaneView("speculative", [proposal, ver, proposal, ver], "p", piece, 8)
    out = render.lane_html(view)
    steps = out.split('<span class="step')
    assert len(steps) == 3 and "tree-step" in steps[1] and " last" in steps[2][:30]
    last = steps[2]
    nodes = re.findall(r'<span class="tnode( on-path)?" style="grid-column:(\d);grid-row:(\d+) / span (\d+)">'
                       r'<span class="tok (\w+)', last)
    # (on path, depth, first row, rows spanned, state) per node: leaves a, d, e, f; b spans d and e
    assert nodes == [("", "1", "2", "1", "rej"), (" on-path", "1", "3", "2", "acc"), ("", "1", "5", "1", "skip"),
                     ("", "2", "3", "1", "rej"), ("", "2", "4", "1", "rej"), ("", "2", "5", "1", "skip")]
    kept = last.split('<span class="kept">')[1].split('<span class="tree-sum">')[0]
    assert "tok acc" in kept and "tok res" in kept and "tok rej" not in kept  # b accepted, z drawn by the target
    assert tree_view.leaf_rows(parents) == [(0, 1), (1, 2), (3, 1), (1, 1), (2, 1), (3, 1)]
    text = narration.narration_html([view])
    assert "a tree of 6 nodes (3 at depth 1, 2 deep)" in text
    assert "<code>a</code> <b>rejected</b> (p/q = 0.20), then <code>b</code> accepted" in text
    assert "<code>z</code> was drawn from the last residual" in text


@pytest.mark.parametrize("broken", [False, True])
def test_the_audit_checks_a_tree(random_models, monkeypatch, broken):
    """`explorer audit --tree`: the exact first-token and two-token tests on tree samples pass, and fail for
    siblings verified without the residual."""
    from explorer.measure.audit import run_audit

    if broken:
        monkeypatch.setattr(tree, "residual_distribution", lambda p, q: p)
    result = run_audit(random_models, "def parse(line):", samples=400, temperature=1.0, top_k=4, tree="3,2")
    assert result.status == ("FAIL" if broken else "PASS"), result.verdict
    assert any("tree 3,2" in note for note in result.notes)


def test_a_tree_at_an_exact_precision_runs_on_the_kernels_and_equals_autoregressive():
    """The exact precisions' kernels take the tree's mask (rowinv.cpp's attend with ``visible``), so a greedy tree
    at int8 gives int8 autoregressive's tokens (before the mask was passed, it did not: measured)."""
    from explorer.precision import kernels

    if not kernels.available():
        pytest.skip("the row-invariant kernel is not built on this machine")
    models = explorer.load_models("tiny", precision="int8")
    for prompt in PROMPTS[:3]:
        ar = explorer.decode("autoregressive", models, prompt, max_new_tokens=20).token_ids
        for shape in ("2,2", "dynamic:6"):
            trace = explorer.decode("speculative", models, prompt, tree=shape, max_new_tokens=20)
            assert trace.stats["precision"] == "int8" and trace.token_ids == ar, (prompt, shape)
