"""The Audit tab's handler: the losslessness audit (measure/audit.py) of the page's prompt and preset, in words."""

from __future__ import annotations

import gradio as gr

from explorer.app import hosting
from explorer.app.hosting import gpu
from explorer.app.lane_settings import load_preset
from explorer.decoding.config import validate_prompt
from explorer.errors import ExplorerError

AUDIT_MAX_SAMPLES = 2000  # one audit request holds the decode slot: bounded


@gpu(hosting.run_duration)
def run_audit_tab(prompt: str, preset: str, temperature: float, top_k: int, gamma: int) -> str:
    """The audit of the current prompt and preset, in words (``audit.report_lines``)."""
    from explorer.measure.audit import (  # deferred: scipy (~1 s) via explorer.measure.audit
        headline,
        report_lines,
        run_audit,
    )

    try:
        validate_prompt(prompt)
        models = load_preset(preset)
        result = run_audit(models, prompt, temperature=float(temperature), top_k=int(top_k), gamma=int(gamma),
                           max_samples=AUDIT_MAX_SAMPLES)
    except ExplorerError as exc:
        raise gr.Error(str(exc), print_exception=False) from None
    lines = report_lines(result)
    return f"### {headline(result)}\n\n```\n" + "\n".join(lines) + "\n```"
