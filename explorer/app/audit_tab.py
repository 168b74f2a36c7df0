"""The Audit tab's handler: the losslessness audit (measure/audit.py) of the page's prompt and preset, in words."""

from __future__ import annotations

import time

import gradio as gr

from explorer.app import hosting
from explorer.app.hosting import gpu
from explorer.app.lane_settings import load_preset
from explorer.decoding.prompting import validate_prompt
from explorer.errors import ExplorerError

AUDIT_MAX_SAMPLES = 2000  # one audit request holds the decode slot: bounded


@gpu(hosting.run_duration)
def run_audit_tab(prompt: str, preset: str, temperature: float, top_k: int, gamma: int,
                  progress: gr.Progress = gr.Progress()) -> str:  # noqa: B008
    """The audit of the current prompt and preset, in words (``audit.report_lines``); a progress line per sample
    ("sample 40 of 1,600, about 90 s left")."""
    from explorer.measure.audit import (  # deferred: scipy (~1 s) via explorer.measure.audit
        headline,
        report_lines,
        run_audit,
    )

    try:
        validate_prompt(prompt)
        models = load_preset(preset, progress)
        started = time.perf_counter()

        def said(done: int, total: int) -> None:
            left = (time.perf_counter() - started) / done * (total - done)
            progress(done / total, desc=f"sample {done:,} of {total:,}, about {left:.0f} s left")

        result = run_audit(models, prompt, temperature=float(temperature), top_k=int(top_k), gamma=int(gamma),
                           max_samples=AUDIT_MAX_SAMPLES, progress=said)
    except ExplorerError as exc:
        raise gr.Error(str(exc), print_exception=False) from None
    lines = report_lines(result)
    return f"### {headline(result)}\n\n```\n" + "\n".join(lines) + "\n```"
