"""The mini training pipeline builds loadable, consistent tiny models (seconds, CPU)."""

import json
import os

import pytest
import torch

from explorer.runtime import make_bidirectional
from explorer.training.tiny.pipeline import train_all
from explorer.training.tiny.recipes import check_bidirectional

MODELS = ("target", "draft", "diffusion")
SNIPPET = "def grüß(x):\n    return f'{x!r} → ✓ 日本語' # 🐍\n\n\tpass  \r\n"


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """Run the whole pipeline on a corpus slice with tiny sizes."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    out = tmp_path_factory.mktemp("tiny")
    report = train_all(out, mini=True)
    return out, report


def load(path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from explorer.compact_weights import from_pretrained

    return from_pretrained(AutoModelForCausalLM, path), AutoTokenizer.from_pretrained(path.parent / "tokenizer")


def test_layout_and_report(built):
    out, report = built
    from explorer.compact_weights import is_compact

    assert (out / "tokenizer" / "tokenizer.json").exists()
    for name in MODELS:
        assert not (out / name / "tokenizer.json").exists()  # one copy, in tokenizer/
        assert is_compact(out / name / "model.safetensors")
    assert not list(out.glob(".*.tmp"))
    saved = json.loads((out / "train_report.json").read_text())
    assert saved["status"] == "complete"
    assert saved["corpus"]["files_train"] > 0 and saved["corpus"]["files_heldout"] > 0
    assert saved["corpus"]["tokens_train"] > 0
    for key in ("target_bpb", "draft_bpb", "unigram_bpb", "draft_target_greedy_agreement"):
        assert key in saved["heldout_ar"]
    assert {"target_1_token", "target_5_tokens", "draft_1_token"} <= set(saved["latency_ms"])
    assert saved["diffusion"]["bidirectional_check"] is True
    assert report["weights_mb"]["total"] < 60


def test_tokenizer_round_trip_and_specials(built):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(built[0] / "tokenizer")
    assert tok.decode(tok(SNIPPET).input_ids) == SNIPPET
    ids = tok("def f():").input_ids
    assert not set(ids) & set(tok.all_special_ids)
    specials = {tok.mask_token_id, tok.pad_token_id, tok.eos_token_id}
    assert None not in specials and len(specials) == 3
    assert tok.bos_token_id == tok.eos_token_id


@pytest.mark.parametrize("name", MODELS)
def test_models_load_offline(built, name):
    model, tok = load(built[0] / name)
    assert model.config.vocab_size == len(tok)
    assert model.dtype == torch.float32
    ids = torch.tensor([tok("x = 1").input_ids])
    with torch.no_grad():
        logits = model(input_ids=ids).logits
    assert logits.shape == (1, ids.shape[1], len(tok))
    assert torch.isfinite(logits).all()


def test_diffusion_is_bidirectional_after_load(built):
    model, tok = load(built[0] / "diffusion")
    assert model.config.is_causal is False
    assert model.config.shift_logits is True
    assert model.config.explorer_kind == "diffusion"
    assert model.config.mask_token_id == tok.mask_token_id
    make_bidirectional(model)
    assert all(not m.is_causal for m in model.modules() if hasattr(m, "is_causal"))
    assert check_bidirectional(model, len(tok))
    ids = torch.tensor([tok("def f(a, b):\n    return a + b\n").input_ids])
    other = ids.clone()
    other[0, -1] = tok.mask_token_id
    with torch.no_grad():
        a = model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits[0, 0]
        b = model(input_ids=other, attention_mask=torch.ones_like(ids)).logits[0, 0]
    assert not torch.allclose(a, b)


def test_target_and_draft_are_causal(built):
    model, tok = load(built[0] / "target")
    assert not check_bidirectional(model, len(tok))
