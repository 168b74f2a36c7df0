"""The public API and the CLI as DESIGN.md fixes them; bad input gets one clear line."""

import json
import math
import subprocess
import sys

import pytest
import torch

import explorer
from explorer.cli import main
from explorer.sampling import warp_logits
from explorer.speculative import acceptance_probability, residual_distribution, verify_drafts

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


BAD_API = [
    ("autoregressive", "", {}),
    ("autoregressive", "   \n", {}),
    ("autoregressive", "x" * 1_000_000, {}),
    ("autoregressive", "abc\x00def", {}),
    ("autoregressive", "bell\x07", {}),
    ("autoregressive", b"\xff\xfe binary", {}),
    ("autoregressive", "lone \udc80 surrogate", {}),
    ("autoregressive", 12345, {}),
    ("teleport", "abc", {}),
    ("autoregressive", "abc", {"max_new_tokens": 0}),
    ("autoregressive", "abc", {"max_new_tokens": -3}),
    ("autoregressive", "abc", {"max_new_tokens": 100_000}),
    ("speculative", "abc", {"gamma": 0}),
    ("speculative", "abc", {"gamma": 1000}),
    ("speculative", "abc", {"drafter": "oracle"}),
    ("autoregressive", "abc", {"temperature": -1.0}),
    ("autoregressive", "abc", {"temperature": float("nan")}),
    ("autoregressive", "abc", {"temperature": float("inf")}),
    ("autoregressive", "abc", {"top_p": 0.0}),
    ("autoregressive", "abc", {"top_p": 1.5}),
    ("diffusion", "abc", {"max_new_tokens": 16, "steps": 0}),
    ("diffusion", "abc", {"max_new_tokens": 16, "steps": 5, "block_length": 8}),
    ("diffusion", "abc", {"max_new_tokens": 16, "block_length": 32}),
    ("diffusion", "abc", {"max_new_tokens": 16, "threshold": 0.0}),
    ("diffusion", "abc", {"max_new_tokens": 16, "threshold": 1.5}),
    ("diffusion", "abc", {"max_new_tokens": 16, "remasking": "sometimes"}),
    ("autoregressive", "abc", {"beam_width": 3}),
]


@pytest.mark.parametrize("method,prompt,options", BAD_API)
def test_bad_input_raises_one_clear_error(random_models, method, prompt, options):
    with pytest.raises(explorer.ExplorerError) as err:
        explorer.decode(method, random_models, prompt, **options)
    assert "\n" not in str(err.value) and len(str(err.value)) < 200


def test_unknown_preset_and_offline_hub_preset_fail_fast():
    with pytest.raises(explorer.ExplorerError, match="unknown preset"):
        explorer.load_models("gpt-17")
    with pytest.raises(explorer.ExplorerError, match="network"):
        explorer.load_models("qwen2.5-7b")


def test_draft_with_another_vocabulary_is_refused(random_models):
    from explorer.models import build_random_llama, check_same_vocabulary

    other = build_random_llama(100, 16, 1, seed=0)
    with pytest.raises(explorer.ExplorerError, match="vocabulary"):
        check_same_vocabulary(random_models.target, other)


def test_trust_remote_code_only_for_allowlisted_ids(monkeypatch):
    """A user-typed model id never reaches from_pretrained with trust_remote_code=True."""
    import transformers

    from explorer import models as models_mod

    calls = []

    def fake(name, *args, **kwargs):
        calls.append((name, kwargs.get("trust_remote_code", False)))
        raise RuntimeError("stop")

    monkeypatch.setattr(models_mod, "_require_network", lambda model_id: None)
    for cls in (transformers.AutoTokenizer, transformers.AutoModelForCausalLM, transformers.AutoModel):
        monkeypatch.setattr(cls, "from_pretrained", fake)
    with pytest.raises(RuntimeError):
        models_mod._load_uncached("custom", torch.device("cpu"), torch.float32,
                                  {"target": "evil/model", "diffusion": "evil/diffusion"})
    assert calls and all(trusted is False for _, trusted in calls)
    assert "evil/diffusion" not in models_mod.TRUST_REMOTE_CODE_ALLOWLIST


# -------------------------------------------------------------------------------- numerics

def test_warp_handles_nan_and_inf_logits():
    logits = torch.tensor([float("nan"), 1.0, float("inf"), -float("inf")])
    for t in (0.0, 0.7):
        p = warp_logits(logits, t, top_k=2)
        assert torch.isfinite(p).all() and math.isclose(float(p.sum()), 1.0, rel_tol=1e-5)
        assert int(p.argmax()) == 2
    dead = warp_logits(torch.full((4,), float("nan")), 1.0)
    assert torch.allclose(dead, torch.full((4,), 0.25))


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


BAD_CLI = [
    ["--preset", "nope", "--method", "speculative"],
    ["--method", "teleport"],
    ["--method", "speculative", "--gamma", "0"],
    ["--method", "autoregressive", "--temperature", "-1"],
    ["--method", "autoregressive", "--temperature", "nan"],
    ["--method", "autoregressive", "--max-new-tokens", "0"],
    ["--method", "autoregressive", "--max-new-tokens", "99999"],
    ["--method", "diffusion", "--max-new-tokens", "16", "--steps", "5", "--block-length", "8"],
    ["--method", "diffusion", "--threshold", "2"],
    ["--method", "autoregressive", "--max-new-tokens", "ten"],
]


@pytest.mark.parametrize("args", BAD_CLI)
def test_cli_bad_input_one_line_no_traceback(capsys, args):
    argv = ["decode", "--prompt", "abc"] + (args if "--preset" in args else ["--preset", "random-tiny", *args])
    code, out, err = run_cli(capsys, *argv)
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("error: ") and "Traceback" not in err


def test_cli_empty_prompt_in_a_real_process():
    proc = subprocess.run([sys.executable, "-m", "explorer", "decode", "--preset", "random-tiny", "--method",
                           "autoregressive", "--prompt", ""], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == ["error: the prompt is empty"]


def test_cli_audit_passes_on_an_exact_sampler(capsys):
    code, out, err = run_cli(capsys, "audit", "--preset", "random-tiny", "--prompt", "abc", "--samples", "300",
                             "--prefix-tokens", "1", "--json")
    assert code == 0
    result = json.loads(out)
    assert result["verdict"].startswith("PASS") and 0 <= result["tv_distance"] <= 1
