"""``python -m explorer decide``: run the checklist (``decide.py``) on a prompt file, print the verdicts, write the
JSON with every figure and the HTML report. A part that cannot run (an unreachable engine, an empty group, a
preset without a draft model) becomes one line in ``errors`` and the rest of the report is still written."""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

import pandas as pd
import plotly.graph_objects as go

import explorer
from explorer.errors import ExplorerError
from explorer.flags import add_model_arguments
from explorer.measure.bench import preset_chain
from explorer.measure.bench_cli import cpu_name, load_average
from explorer.measure.decide import (
    QUALITY_RULE,
    DecideSettings,
    batch_sentence,
    categories,
    diffusion_rows,
    group_rows,
    measured_batch,
    memory_rows,
    predicted_batch,
    run_traffic,
    swap_rows,
    tail_rows,
)
from explorer.measure.report import Section, frontier_figure, write_report
from explorer.measure.workload import PromptSet, load_prompt_set
from explorer.runtime import Models


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_model_arguments(p)
    p.add_argument("--prompts", required=True, help="your traffic: one prompt a line, or JSONL with \"prompt\" and "
                   "optional \"category\", \"temperature\", \"id\"")
    p.add_argument("--limit", type=int, default=None, help="use the first N prompts")
    p.add_argument("--temperatures", default="0", help="comma-separated sampling temperatures (default: 0)")
    p.add_argument("--max-new-tokens", type=int, default=64, help="tokens per request (default: 64)")
    p.add_argument("--gamma", type=int, default=None, help="draft length (default: the preset's)")
    p.add_argument("--drafter", default=None, help="speculative drafter (default: the preset's)")
    p.add_argument("--repeats", type=int, default=1, help="requests per prompt and setting (default: 1)")
    p.add_argument("--engine", default=None, help="a vLLM server with speculation on (measures the batch effect)")
    p.add_argument("--compare", default=None, help="the same model served with speculation off (with --engine)")
    p.add_argument("--swap", default=None, help="a second target variant: a preset name (its own precision or "
                   "fine-tune); the same traffic is re-measured on it")
    p.add_argument("--no-diffusion", action="store_true", help="skip the diffusion part")
    p.add_argument("--html", default=None, help="write the HTML report here")
    p.add_argument("--json", default=None, help="write every figure as JSON here")


def settings_from(args: argparse.Namespace) -> DecideSettings:
    try:
        temps = tuple(float(t) for t in args.temperatures.split(",") if t.strip())
    except ValueError:
        raise ExplorerError(f"--temperatures: comma-separated numbers such as 0,1 (got {args.temperatures!r})"
                            ) from None
    if not temps or any(not math.isfinite(t) or t < 0 for t in temps):
        raise ExplorerError(f"--temperatures must be numbers >= 0 (got {args.temperatures!r})")
    if args.max_new_tokens < 1 or args.repeats < 1:
        raise ExplorerError("--max-new-tokens and --repeats must be >= 1")
    if bool(args.engine) != bool(args.compare):
        raise ExplorerError("--engine and --compare go together: the server with speculation on, and off")
    return DecideSettings(max_new_tokens=args.max_new_tokens, temperatures=temps, gamma=args.gamma,
                          drafter=args.drafter, repeats=args.repeats, diffusion_divisors=() if args.no_diffusion
                          else DecideSettings.diffusion_divisors, progress=sys.stderr.isatty())


def _part(result: dict, name: str, fn):
    """Run one part; any error becomes one line in result["errors"] and the part is left empty (the rest of the
    checklist is still measured and shown)."""
    try:
        result[name] = fn()
    except ExplorerError as exc:
        result["errors"].append(f"{name}: {exc}")
        result[name] = []
    except Exception as exc:  # noqa: BLE001 - one part's failure must not empty the whole checklist
        result["errors"].append(f"{name}: {type(exc).__name__}: {exc}")
        result[name] = []


def decide(models: Models, sets: list[PromptSet], s: DecideSettings, engine: str | None = None,
           compare: str | None = None, swap: Models | None = None) -> dict:
    """Every part of the checklist; the JSON the CLI writes."""
    result: dict = {"errors": [], "header": header(models, sets, s)}
    frame = run_traffic(models, sets, s)
    declared = {p.category for ps in sets for p in ps.prompts if p.category}
    for empty in sorted(declared - set(frame["category"])):
        result["errors"].append(f"group {empty!r}: none of its prompts fit the model's context; no numbers for it")
    result["groups"] = group_rows(frame)
    result["verdicts"] = [r["line"] for r in result["groups"]]
    result["tail"] = tail_rows(frame)
    overall = result["groups"][-1]["acceptance"]
    drafter = s.drafter or models.preset.drafter
    if engine:
        _part(result, "batch", lambda: measured_batch(engine, compare, sets, s))
    if not engine or not result["batch"]:
        if models.draft is None:
            result["errors"].append(f"batch: preset {models.preset.name!r} has no draft model to time")
            result["batch"] = []
        else:
            _part(result, "batch", lambda: predicted_batch(models, s, 0.0 if math.isnan(overall) else overall))
    _part(result, "memory", lambda: memory_rows(models, frame, drafter))
    if swap is not None:
        _part(result, "swap", lambda: swap_rows(result["groups"], group_rows(run_traffic(swap, sets, s, " swap")),
                                                swap.preset.name))
    if s.diffusion_divisors:
        _part(result, "diffusion", lambda: diffusion_rows(models, sets, s, categories(models, sets, s)[0]))
    result["requests"] = frame.drop(columns=["itl_s", "token_ids"], errors="ignore").to_dict("records")
    return result


def header(models: Models, sets: list[PromptSet], s: DecideSettings) -> dict[str, str]:
    return {"machine": f"{cpu_name()}, {os.cpu_count()} logical CPUs, load {load_average()}",
            "preset": models.preset.name, "device": str(models.device),
            "precision": str(getattr(models, "precision", None) or models.dtype).replace("torch.", ""),
            "models": "; ".join(f"{k}: {v}" for k, v in models.names.items()),
            "traffic": "; ".join(f"{ps.source} ({len(ps.prompts)} prompts)" for ps in sets),
            "settings": f"N = {s.max_new_tokens}, T in {list(s.temperatures)}, "
                        f"{preset_chain(models, s.gamma, s.drafter or models.preset.drafter)[2]}, "
                        f"{s.repeats} repeat(s); batch size 1 "
                        "(one request at a time) unless an engine was given",
            "date (UTC)": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())}


def sections(result: dict) -> list[Section]:
    g = pd.DataFrame(result["groups"])
    fig = go.Figure()
    for col, name in (("speedup", "speedup vs AR"), ("acceptance", "acceptance")):
        fig.add_bar(x=g["group"], y=g[col], name=name, error_y=dict(type="data", symmetric=False,
                    array=g[f"{col}_hi"] - g[col], arrayminus=g[col] - g[f"{col}_lo"]))
    fig.add_hline(y=1, line_dash="dot")
    fig.update_layout(title="Per group: speedup and acceptance (95% bootstrap intervals)", barmode="group",
                      template="plotly_white", height=420)
    tail = pd.DataFrame(result["tail"])
    out = [Section("Verdicts", [], {}, result["verdicts"] + [f"error: {e}" for e in result["errors"]]),
           Section("1. Acceptance on your traffic, by group", [fig], {"groups": g}),
           Section("2. The tail (p50 / p95 / p99)", [], {"percentiles (ms)": tail})]
    batch = result.get("batch") or {}
    if batch:
        out.append(Section(f"3. Batch size ({batch['source']})", [], {"by batch": pd.DataFrame(batch["rows"])},
                           [batch["how"], batch_sentence(batch)]))
    out.append(Section("4. The drafter's memory (measured)", [], {"memory": pd.DataFrame(result["memory"])}))
    if result.get("swap"):
        out.append(Section("5. After a swap", [], {"swap": pd.DataFrame(result["swap"])}))
    if result.get("diffusion"):
        out.append(Section("6. Diffusion: where quality holds", [frontier_figure(result["diffusion"])],
                           {"diffusion": pd.DataFrame(result["diffusion"])},
                           [f"quality holds: {QUALITY_RULE}; beats AR: quality holds and the speedup's interval "
                            "lies above 1"]))
    return out


def clean(obj):
    """JSON-ready: NaN and infinities become null, numpy scalars plain numbers."""
    if isinstance(obj, dict):
        return {str(k): clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [clean(v) for v in obj]
    if hasattr(obj, "item") and not isinstance(obj, (str, bytes)):
        obj = obj.item()
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj if isinstance(obj, (str, int, float, bool, type(None))) else str(obj)


def run(args: argparse.Namespace) -> int:
    s = settings_from(args)
    sets = [load_prompt_set(args.prompts, args.limit)]
    models = explorer.load_models(args.preset, device=args.device, dtype=args.dtype)
    swap = explorer.load_models(args.swap, device=args.device) if args.swap else None
    result = decide(models, sets, s, args.engine, args.compare, swap)
    for line in result["verdicts"] + ([batch_sentence(result["batch"])] if result.get("batch") else []):
        print(line)
    for line in result["errors"]:
        print(f"error: {line}", file=sys.stderr)
    if args.json:
        Path(args.json).write_text(json.dumps(clean(result), indent=2, allow_nan=False))
        print(f"wrote {args.json}")
    if args.html:
        write_report(args.html, result["header"], sections(result), title="Decoding explorer: the decision")
        print(f"wrote {args.html}")
    return 0
