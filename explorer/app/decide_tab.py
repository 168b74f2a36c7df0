"""The "Deployment checklist" tab: the checklist filled in from the visitor's own prompts (``explorer decide``)."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import gradio as gr
import pandas as pd

from explorer.app.lane_settings import load_preset
from explorer.app.page import read_text
from explorer.errors import ExplorerError
from explorer.measure.decide import DecideSettings, batch_sentence
from explorer.measure.decide_cli import clean, decide, sections
from explorer.measure.report import write_report
from explorer.measure.workload import PromptSet, parse_prompts, read_prompt_text

MAX_PROMPTS, MAX_NEW_TOKENS = 24, 64  # a request of the page's: bounded so that one visitor cannot hold the server
EXAMPLE = "\n".join([
    '{"prompt": "Write a Python function that reverses a string.", "category": "code"}',
    '{"prompt": "Write a Python function that checks whether a number is prime.", "category": "code"}',
    '{"prompt": "Write a Python function that merges two sorted lists.", "category": "code"}',
    '{"prompt": "Explain photosynthesis in simple terms.", "category": "prose"}',
    '{"prompt": "Tell me about the water cycle.", "category": "prose"}',
    '{"prompt": "Give me three facts about honeybees.", "category": "prose"}'])


def decide_tab(preset: str, text: str, upload: str | None, temperatures: str, max_new: int, diffusion: bool):
    """Decode the prompts (AR and speculative, interleaved), fill in the checklist, return its tables and files."""
    try:
        source = read_prompt_text(Path(upload)) if upload else text
        if not (source or "").strip():
            raise ExplorerError("paste prompts (one a line, or JSONL with \"prompt\" and \"category\") "
                                "or upload a file")
        prompts = parse_prompts(source, "the prompts")
        if len(prompts) > MAX_PROMPTS:
            raise ExplorerError(f"{len(prompts)} prompts; the page decides on at most {MAX_PROMPTS} (use "
                                "`python -m explorer decide` for more)")
        try:
            temps = tuple(float(t) for t in (temperatures or "0").split(",") if t.strip())
        except ValueError:
            raise ExplorerError(f"temperatures: comma-separated numbers such as 0,1 (got {temperatures!r})") from None
        if not temps or any(t < 0 for t in temps) or len(temps) > 3:
            raise ExplorerError("temperatures: one to three numbers >= 0")
        s = DecideSettings(max_new_tokens=int(max_new), temperatures=temps, progress=False,
                           diffusion_divisors=DecideSettings.diffusion_divisors if diffusion else ())
        result = decide(load_preset(preset), [PromptSet("your prompts", "the page", tuple(prompts))], s)
    except ExplorerError as exc:
        raise gr.Error(str(exc), print_exception=False) from None
    out = Path(tempfile.mkdtemp(prefix="decide-"))
    (out / "decision.json").write_text(json.dumps(clean(result), indent=2, allow_nan=False))
    write_report(out / "decision.html", result["header"], sections(result), title="Decoding explorer: the decision")
    lines = [f"- {line}" for line in result["verdicts"]] + [f"- error: {e}" for e in result["errors"]]
    batch = result.get("batch") or {}
    if batch:
        lines.append(f"- {batch_sentence(batch)}")
    groups = pd.DataFrame(result["groups"])[["group", "requests", "acceptance", "acceptance_lo", "acceptance_hi",
                                             "tokens_per_pass", "speedup", "speedup_lo", "speedup_hi", "verdict"]]
    tail = pd.DataFrame(result["tail"])[["group", "method", "metric", "n", "mean_ms", "p50_ms", "p95_ms", "p99_ms",
                                         "p99_lo_ms", "p99_hi_ms"]]
    return ("\n".join(lines), groups.round(3), tail.round(1), pd.DataFrame(result["memory"]),
            pd.DataFrame(result.get("diffusion") or []), [str(out / "decision.json"), str(out / "decision.html")])


def build_decide_tab(preset: gr.components.Component) -> None:
    with gr.Accordion("The checklist", open=False):
        gr.Markdown(read_text("checklist.md"))
    gr.Markdown("Paste or upload your own prompts: each is decoded with and without speculation, one request at a "
                f"time, and every item of the checklist is answered from them (at most {MAX_PROMPTS} prompts here; "
                "`python -m explorer decide` has no such limit and can measure a live engine's batch effect).")
    with gr.Row():
        text = gr.Textbox(EXAMPLE, lines=6, max_lines=12, label="Prompts (one a line, or JSONL with a category)",
                          elem_id="decide-prompts", scale=3)
        with gr.Column(scale=1, min_width=220):
            upload = gr.File(label="or a prompt file", file_types=[".txt", ".jsonl"], type="filepath")
            temperatures = gr.Textbox("0", label="Temperatures (comma-separated)")
            max_new = gr.Slider(8, MAX_NEW_TOKENS, value=32, step=8, label="New tokens per request (N)")
            diffusion = gr.Checkbox(True, label="Also find where diffusion's quality holds")
            go = gr.Button("Decide on these prompts", variant="primary", elem_id="decide-run")
    verdicts = gr.Markdown(elem_id="decide-verdicts")
    groups = gr.Dataframe(label="1. Acceptance and speedup by group (95% bootstrap intervals)", wrap=True)
    tail = gr.Dataframe(label="2. The tail: request and inter-token latency percentiles (ms)", wrap=True)
    memory = gr.Dataframe(label="4. The drafter's memory at your lengths (measured)", wrap=True)
    diff = gr.Dataframe(label="6. Diffusion: K (or threshold) where quality holds", wrap=True)
    files = gr.Files(label="The decision as JSON and HTML")
    go.click(decide_tab, [preset, text, upload, temperatures, max_new, diffusion],
             [verdicts, groups, tail, memory, diff, files], api_name="decide", concurrency_id="decode",
             concurrency_limit=1, show_progress_on=verdicts)
