"""The public API and the CLI as docs/design.md fixes them; bad input gets one clear line."""

import json
import math
import re
import subprocess
import sys

import pytest
import torch

import explorer
from explorer.cli import main
from explorer.decoding.sampling import warp_logits
from explorer.decoding.speculative import acceptance_probability, residual_distribution, verify_drafts

STATS_KEYS = {"new_tokens", "target_forward_passes", "draft_forward_passes", "proposed", "accepted",
              "acceptance_rate", "wall_s", "ttft_s"}


@pytest.mark.parametrize("method", ["autoregressive", "speculative", "diffusion"])
def test_decode_returns_trace_with_contract_fields(random_models, method):
    trace = explorer.decode(method, random_models, "def parse(line):", max_new_tokens=8, temperature=0.0, seed=0,
                            gamma=4)
    assert isinstance(trace, explorer.Trace)
    assert STATS_KEYS <= set(trace.stats)
    assert isinstance(trace.text, str) and isinstance(trace.token_ids, list) and trace.events
    assert trace.stats["new_tokens"] == len(trace.token_ids) <= 8
    assert trace.stats["prompt_format"] == "raw"
    assert trace.prompt_ids == random_models.tokenizer("def parse(line):").input_ids
    assert trace.text == random_models.tokenizer.decode(trace.token_ids, skip_special_tokens=True)
    json.loads(trace.to_json())


def test_stream_yields_events_then_returns_the_trace(random_models):
    gen = explorer.stream("speculative", random_models, "abc", max_new_tokens=6)
    events = []
    with pytest.raises(StopIteration) as stop:
        while True:
            events.append(next(gen))
    assert stop.value.value.events == events


BAD_API = [  # (method, prompt, options, the message that names the check)
    ("autoregressive", "", {}, "the prompt is empty"),
    ("autoregressive", "   \n", {}, "the prompt is empty"),
    ("autoregressive", "x" * 1_000_000, {}, "the prompt is too long"),
    ("autoregressive", "abc\x00def", {}, r"control character \(U\+0000\)"),
    ("autoregressive", "bell\x07", {}, r"control character \(U\+0007\)"),
    ("autoregressive", b"\xff\xfe binary", {}, "not valid UTF-8 text$"),
    ("autoregressive", "lone \udc80 surrogate", {}, "lone surrogates"),
    ("autoregressive", 12345, {}, "the prompt must be text"),
    ("teleport", "abc", {}, "unknown method 'teleport'"),
    ("autoregressive", "abc", {"max_new_tokens": 0}, r"max_new_tokens must be a whole number >= 1 \(got 0\)"),
    ("autoregressive", "abc", {"max_new_tokens": -3}, r"max_new_tokens must be a whole number >= 1 \(got -3\)"),
    ("autoregressive", "abc", {"max_new_tokens": 100_000}, "exceeds the model's context"),
    ("speculative", "abc", {"gamma": 0}, r"gamma must be between 1 and 64 \(got 0\)"),
    ("speculative", "abc", {"gamma": 1000}, r"gamma must be between 1 and 64 \(got 1000\)"),
    ("speculative", "abc", {"drafter": "oracle"}, "unknown drafter 'oracle'"),
    ("autoregressive", "abc", {"temperature": -1.0}, r"temperature must be a finite number >= 0 \(got -1.0\)"),
    ("autoregressive", "abc", {"temperature": float("nan")}, r"temperature must be .* \(got nan\)"),
    ("autoregressive", "abc", {"temperature": float("inf")}, r"temperature must be .* \(got inf\)"),
    ("autoregressive", "abc", {"top_k": 0}, r"top_k must be >= 1 \(got 0\)"),
    ("autoregressive", "abc", {"top_p": 0.0}, r"top_p must be in \(0, 1\] \(got 0.0\)"),
    ("autoregressive", "abc", {"top_p": 1.5}, r"top_p must be in \(0, 1\] \(got 1.5\)"),
    ("diffusion", "abc", {"max_new_tokens": 16, "steps": 0}, r"steps must be a whole number >= 1 \(got 0\)"),
    ("diffusion", "abc", {"max_new_tokens": 16, "steps": 32}, r"steps \(32\) cannot exceed max_new_tokens \(16\)"),
    ("diffusion", "abc", {"max_new_tokens": 16, "steps": 5, "block_length": 8},
     r"steps \(5\) must be a multiple of the number of blocks \(2 = 16 / 8\)"),
    ("diffusion", "abc", {"max_new_tokens": 16, "block_length": 32},
     r"block_length \(32\) cannot exceed max_new_tokens \(16\)"),
    ("diffusion", "abc", {"max_new_tokens": 16, "block_length": 5},
     r"max_new_tokens \(16\) must be a multiple of block_length \(5\)"),
    ("diffusion", "abc", {"max_new_tokens": 16, "threshold": 0.0}, r"threshold must be in \(0, 1\] \(got 0.0\)"),
    ("diffusion", "abc", {"max_new_tokens": 16, "threshold": 1.5}, r"threshold must be in \(0, 1\] \(got 1.5\)"),
    ("diffusion", "abc", {"max_new_tokens": 16, "remasking": "sometimes"}, "unknown remasking 'sometimes'"),
    ("autoregressive", "abc", {"beam_width": 3}, "unknown option.*beam_width"),
    ("speculative", "abc", {"draft_confidence": 0.0}, r"draft_confidence must be in \(0, 1\] \(got 0.0\)"),
    ("speculative", "abc", {"draft_confidence": 1.5}, r"draft_confidence must be in \(0, 1\] \(got 1.5\)"),
    ("speculative", "abc", {"draft_confidence": 0.5, "drafter": "prompt_lookup"},
     "draft_confidence needs a drafter that gives a distribution"),
    ("speculative", "abc", {"draft_confidence": 0.5, "tree": "2,1"}, "draft_confidence cuts a chain"),
]


@pytest.mark.parametrize("method,prompt,options,message", BAD_API)
def test_bad_input_raises_one_clear_error(random_models, method, prompt, options, message):
    with pytest.raises(explorer.ExplorerError, match=message) as err:
        explorer.decode(method, random_models, prompt, **options)
    assert "\n" not in str(err.value) and len(str(err.value)) < 200


def test_unknown_preset_and_offline_hub_preset_fail_fast():
    with pytest.raises(explorer.ExplorerError, match="unknown preset"):
        explorer.load_models("gpt-17")
    with pytest.raises(explorer.ExplorerError, match="network"):
        explorer.load_models("qwen2.5-7b")


def test_draft_with_another_vocabulary_is_refused(random_models):
    from explorer.families.random_tiny import build_random_llama
    from explorer.runtime import check_same_vocabulary

    other = build_random_llama(100, 16, 1, seed=0)
    with pytest.raises(explorer.ExplorerError, match="vocabulary"):
        check_same_vocabulary(random_models.target, other)


def load_hub_recording(monkeypatch, name, hub_ids):
    """Run the hub loader with transformers' loaders replaced by recorders that return small real objects."""
    import transformers

    from explorer import models as models_mod
    from explorer.families.random_tiny import build_random_llama
    from explorer.runtime import build_byte_tokenizer

    calls = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # GPU presets refuse to load without CUDA

    def loader(kind):
        def from_pretrained(model_id, *args, **kwargs):
            calls.append((kind, model_id, kwargs.get("trust_remote_code")))
            if kind == "tokenizer":
                return build_byte_tokenizer()
            return build_random_llama(260, 8, 1, seed=0)
        return from_pretrained

    monkeypatch.setattr(models_mod, "require_network", lambda model_id: None)
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", loader("tokenizer"))
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", loader("causal"))
    monkeypatch.setattr(transformers.AutoModel, "from_pretrained", loader("model"))
    models = models_mod._load_uncached(name, torch.device("cpu"), torch.float32, hub_ids)
    return models, calls


def test_trust_remote_code_only_for_allowlisted_ids(monkeypatch):
    """The diffusion branch runs: remote code for an allowlisted id (Dream), never for a typed id."""
    models, calls = load_hub_recording(monkeypatch, "qwen2.5-7b", {})
    dream = "Dream-org/Dream-v0-Instruct-7B"
    assert models.diffusion is not None and models.diffusion_shift  # Dream predicts the next position
    assert [(kind, trusted) for kind, model_id, trusted in calls if model_id == dream] == [
        ("tokenizer", True), ("model", True)]
    assert all(not trusted for _, model_id, trusted in calls if model_id != dream)

    models, calls = load_hub_recording(monkeypatch, "custom", {"target": "evil/model", "diffusion": "evil/diffusion"})
    assert models.diffusion is not None and not models.diffusion_shift
    assert [(kind, trusted) for kind, model_id, trusted in calls if model_id == "evil/diffusion"] == [
        ("tokenizer", False), ("model", False)]
    assert all(not trusted for *_, trusted in calls)


# -------------------------------------------------------------------------------- numerics

def test_warp_handles_nan_and_inf_logits():
    logits = torch.tensor([float("nan"), 1.0, float("inf"), -float("inf")])
    for t in (0.0, 0.7):
        p = warp_logits(logits, t, top_k=2)
        assert torch.isfinite(p).all() and math.isclose(float(p.sum()), 1.0, rel_tol=1e-5)
        assert int(p.argmax()) == 2
    dead = warp_logits(torch.full((4,), float("nan")), 1.0)
    assert torch.allclose(dead, torch.full((4,), 0.25))


def test_greedy_argmax_equals_the_argmax_of_the_sanitized_logits():
    """The T = 0 shortcut (no sanitizing of the whole vocabulary) picks what the full rule picks, NaN, ±inf, ties
    and dead rows included."""
    from explorer.decoding.sampling import fast_argmax, greedy_argmax, sanitize_logits

    nan, inf = float("nan"), float("inf")
    rows = [[nan, 1.0, inf, -inf], [1.0, inf, 2.0, inf], [-inf] * 4, [nan] * 4, [nan, -inf, -inf, 0.5],
            [3.0, 3.0, 1.0, 2.0], [-inf, -inf, -1.0, nan], [0.1, 0.2, 0.3, 0.4]]
    for row in rows:
        logits = torch.tensor(row)
        assert int(greedy_argmax(logits)) == int(sanitize_logits(logits).argmax()), row
    batch = torch.tensor(rows)
    assert torch.equal(greedy_argmax(batch), sanitize_logits(batch).argmax(-1))
    noisy = torch.randn(64, 300, generator=torch.Generator().manual_seed(0))
    noisy[noisy > 2.2] = nan
    assert torch.equal(greedy_argmax(noisy), sanitize_logits(noisy).argmax(-1))
    ties = torch.randint(0, 3, (64, 300), generator=torch.Generator().manual_seed(1)).float()
    ties[5, 7] = nan
    for x in (ties, ties.double(), ties[:, ::2], ties[3], torch.tensor([nan, 1.0])):
        assert torch.equal(fast_argmax(x), x.argmax(-1)), x.shape  # numpy's argmax picks torch's index


def test_top_p_keeps_smallest_set_reaching_p():
    logits = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    p = warp_logits(logits, 1.0, top_p=0.8)
    assert (p > 0).tolist() == [True, True, False, False]
    p = warp_logits(logits, 1.0, top_p=0.81)
    assert (p > 0).tolist() == [True, True, True, False]


def test_guards_q_zero_and_all_zero_residual():
    assert acceptance_probability(0.3, 0.0) == 1.0
    assert acceptance_probability(0.0, 0.0) == 0.0
    p = torch.tensor([0.2, 0.8])
    assert torch.equal(residual_distribution(p, p.clone()), p)
    gen = torch.Generator().manual_seed(0)
    q = torch.tensor([[0.0, 1.0]])
    n, checks, nxt, bonus = verify_drafts(torch.tensor([[0.0, 1.0], [1.0, 0.0]]), q, [1], gen)
    assert n == 1 and bonus and nxt == 0


# -------------------------------------------------------------------------------- CLI

def run_cli(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_decode_json_schema(capsys):
    code, out, err = run_cli(capsys, "decode", "--preset", "random-tiny", "--method", "speculative", "--prompt",
                             "def f(x):", "--max-new-tokens", "8", "--gamma", "3", "--json")
    assert code == 0
    obj = json.loads(out)
    assert {"text", "token_ids", "stats", "prompt", "method", "config"} <= set(obj)
    assert STATS_KEYS <= set(obj["stats"]) and obj["config"]["gamma"] == 3


BAD_CLI = [  # (arguments, the message that names the check)
    (["--preset", "nope", "--method", "speculative"], "unknown preset 'nope'"),
    (["--method", "teleport"], "unknown method 'teleport'"),
    (["--method", "speculative", "--gamma", "0"], r"gamma must be between 1 and 64 \(got 0\)"),
    (["--method", "speculative", "--gamma", "65"], r"gamma must be between 1 and 64 \(got 65\)"),
    (["--method", "autoregressive", "--top-k", "0"], r"top_k must be >= 1 \(got 0\)"),
    (["--method", "autoregressive", "--temperature", "-1"], r"temperature must be .* \(got -1.0\)"),
    (["--method", "autoregressive", "--temperature", "nan"], r"temperature must be .* \(got nan\)"),
    (["--method", "autoregressive", "--max-new-tokens", "0"], r"max_new_tokens must be .* \(got 0\)"),
    (["--method", "autoregressive", "--max-new-tokens", "99999"], "exceeds the model's context"),
    (["--method", "diffusion", "--max-new-tokens", "16", "--steps", "5", "--block-length", "8"],
     r"steps \(5\) must be a multiple of the number of blocks"),
    (["--method", "diffusion", "--max-new-tokens", "16", "--steps", "32"], r"steps \(32\) cannot exceed"),
    (["--method", "diffusion", "--max-new-tokens", "8", "--block-length", "16"], r"block_length \(16\) cannot exceed"),
    (["--method", "diffusion", "--threshold", "2"], r"threshold must be in \(0, 1\] \(got 2.0\)"),
    (["--method", "autoregressive", "--max-new-tokens", "ten"], "invalid int value: 'ten'"),
]


@pytest.mark.parametrize("args,message", BAD_CLI)
def test_cli_bad_input_one_line_no_traceback(capsys, args, message):
    argv = ["decode", "--prompt", "abc"] + (args if "--preset" in args else ["--preset", "random-tiny", *args])
    code, out, err = run_cli(capsys, *argv)
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("error: ") and "Traceback" not in err
    assert re.search(message, err), err


def test_cli_empty_prompt_in_a_real_process():
    proc = subprocess.run([sys.executable, "-m", "explorer", "decode", "--preset", "random-tiny", "--method",
                           "autoregressive", "--prompt", ""], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == ["error: the prompt is empty"]


def test_cli_audit_verdicts_json_and_text(capsys):
    """Default sample count (enough for the known bugs): PASS, exit 0; too few: INCONCLUSIVE, exit 3."""
    args = ["audit", "--preset", "random-tiny", "--prompt", "abc", "--top-k", "3", "--gamma", "2"]
    code, out, err = run_cli(capsys, *args, "--json")
    result = json.loads(out)
    assert code == 0 and result["status"] == "PASS" and result["verdict"].startswith("PASS")
    assert result["samples"] >= result["samples_needed"] and result["min_detectable_tv"] < 1
    assert {b["name"] for b in result["bugs"]} == {"no_residual", "q_before_warping", "bonus_from_draft"}
    assert "audit: " in err  # progress
    code, out, err = run_cli(capsys, *args, "--samples", "10", "--control")
    assert code == 3 and out.strip().splitlines()[-1].startswith("INCONCLUSIVE")
    assert re.search(r"about \d+ samples would suffice", out)  # with the control: 4 tests, a stricter level
    assert "two-sample AR vs speculative" in out


def test_every_drafter_meets_the_drafter_protocol(random_models):
    """make_drafter returns a Drafter; a proposal has g <= gamma tokens and one q row (V,) per token."""
    from explorer.decoding.config import DecodeConfig
    from explorer.decoding.drafters import Draft, Drafter, available_drafters, make_drafter
    from explorer.decoding.sampling import make_generator

    ids = random_models.tokenizer("def parse(line): return line def parse(").input_ids
    vocab = random_models.target.get_output_embeddings().weight.shape[0]
    for name in available_drafters(random_models):
        cfg = DecodeConfig(drafter=name, temperature=1.0)
        drafter = make_drafter(random_models, cfg)
        assert isinstance(drafter, Drafter) and isinstance(drafter.name, str)
        draft = drafter.propose(ids, 3, cfg, make_generator(0))
        assert isinstance(draft, Draft) and len(draft.tokens) <= 3
        if draft.tokens:
            assert tuple(draft.q.shape) == (len(draft.tokens), vocab)
        drafter.rollback(len(ids))
        assert drafter.cache_len is None or drafter.cache_len <= len(ids)


def test_every_cli_flag_has_help_and_every_decode_option_a_flag():
    """One source: each DecodeConfig field is a `decode` flag with config.OPTION_HELP's sentence as help."""
    import argparse
    import dataclasses

    from explorer.cli import build_parser
    from explorer.decoding.config import OPTION_HELP, DecodeConfig

    names = {f.name for f in dataclasses.fields(DecodeConfig)}
    assert set(OPTION_HELP) == names
    commands = build_parser()._subparsers._group_actions[0].choices
    engine = commands["engine"]._subparsers._group_actions[0].choices
    parsers = [*commands.items(), *((f"engine {name}", sub) for name, sub in engine.items())]
    for command, sub in parsers:
        for action in sub._actions:
            if not isinstance(action, argparse._HelpAction):
                assert action.help, f"{command} {action.option_strings} has no help"
    decode = {a.dest: a for a in commands["decode"]._actions}
    for name in names:
        assert decode[name].help.startswith(OPTION_HELP[name].split(" (default")[0]), name
