"""``python -m explorer decode | audit | bench | engine | loadtest | deploy-space`` (contract: docs/design.md).

Bad input exits with status 2 and one clear line on stderr, never a traceback. The decoding flags are
made from ``config.DecodeConfig`` (one flag per field, its help from ``config.OPTION_HELP``).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import fields

import torch

import explorer
from explorer.app.hosting import deploy_space
from explorer.decoding.config import METHODS, DecodeConfig, validate
from explorer.decoding.prompting import validate_prompt
from explorer.engine import commands as engine_commands
from explorer.errors import ExplorerError
from explorer.flags import add_model_arguments, add_option_arguments, option_help
from explorer.measure import bench_cli, decide_cli
from explorer.models import DEFAULT_PRESET
from explorer.precision import choice, kernels

DECODE_OPTIONS = [f.name for f in fields(DecodeConfig)]  # one flag each: --max-new-tokens ...
AUDIT_OPTIONS = ["temperature", "top_k", "top_p", "seed", "gamma", "drafter", "max_ngram", "early_exit_layers", "tree",
                 "draft_confidence"]
AUDIT_UNUSED = ["max_new_tokens", "adaptive_gamma", "draft_passes"]  # accepted (as ever), not used by the audit


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, not usage + message
        raise ExplorerError(message)


def _add_common(p: argparse.ArgumentParser) -> None:
    add_model_arguments(p)
    p.add_argument("--prompt", required=True, help="the prompt text (plain presets: tokenized as is)")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="python -m explorer", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    d = sub.add_parser("decode", help="decode one prompt with one method")
    _add_common(d)
    add_option_arguments(d, DECODE_OPTIONS)
    d.add_argument("--method", required=True, help=f"one of {', '.join(METHODS)}")
    d.add_argument("--json", action="store_true", help="print one JSON object (the trace)")
    d.add_argument("--events", action="store_true", help="with --json: include every event")
    d.add_argument("--verbose", action="store_true",
                   help="say on stderr what ran: the precision (and the measurement behind it), the kernel path")
    a = sub.add_parser("audit", help="check that speculative sampling preserves the target distribution")
    _add_common(a)
    a.add_argument("--temperature", type=float, default=None, help=option_help("temperature", 1.0))
    add_option_arguments(a, AUDIT_OPTIONS[1:])
    add_option_arguments(a, AUDIT_UNUSED, hidden=True)
    a.add_argument("--samples", type=int, default=None,
                   help="samples of the speculative decoder (default: as many as make the known bugs detectable)")
    a.add_argument("--until-detectable", action="store_true",
                   help="raise --samples to the count at which the known bugs are detectable (up to --max-samples)")
    a.add_argument("--max-samples", type=int, default=20_000, help="the most --until-detectable may raise it to")
    a.add_argument("--control", action="store_true", default=None,
                   help="also sample the autoregressive decoder (always done when the exact tests do not cover "
                        "every compared token)")
    a.add_argument("--prefix-tokens", type=int, default=2,
                   help="output tokens compared, 1..4 (their joint distribution is tested)")
    a.add_argument("--json", action="store_true", help="print one JSON object; exit 0 PASS, 1 FAIL, 3 INCONCLUSIVE")
    lt = sub.add_parser("loadtest", help="drive the app with concurrent sessions on loopback; --soak for memory")
    lt.add_argument("--preset", default=DEFAULT_PRESET, help=f"model bundle the app serves (default: {DEFAULT_PRESET})")
    lt.add_argument("--clients", type=int, default=8, help="concurrent sessions, 1..64")
    lt.add_argument("--runs", type=int, default=3, help="runs per session")
    lt.add_argument("--max-new-tokens", type=int, default=16, help="tokens each lane decodes per run")
    lt.add_argument("--url", default=None, help="a running app on a loopback address (default: start one)")
    lt.add_argument("--soak", action="store_true", help="sample resident memory every 10 runs")
    lt.add_argument("--json", action="store_true", help="print one JSON object (the summary)")
    ds = sub.add_parser("deploy-space", help="build, check and upload the app as a Hugging Face Space")
    ds.add_argument("--repo", required=True, help="user/name of the Space (created if missing)")
    ds.add_argument("--dry-run", action="store_true", help="build and check the bundle only; upload nothing")
    ds.add_argument("--out", default=None, help="build the bundle in this folder (default: a temporary one)")
    ds.add_argument("--private", action="store_true", help="create the Space private")
    e = sub.add_parser("engine", help="start, measure and cross-check a live vLLM server (engine mode)")
    engine_commands.add_arguments(e, _Parser)
    dc = sub.add_parser("decide", help="the deployment checklist on your prompts: acceptance by group, the tail, "
                        "batch, memory, a swap, diffusion, and a verdict per group")
    decide_cli.add_arguments(dc)
    b = sub.add_parser("bench", help="run a workload and print p50/p95/p99")
    bench_cli.add_arguments(b)
    return parser


def _options(args: argparse.Namespace, names: list[str]) -> dict:
    return {n: getattr(args, n) for n in names if getattr(args, n, None) is not None}


def run_decode(args: argparse.Namespace) -> int:
    options = _options(args, DECODE_OPTIONS)
    validate(args.method, DecodeConfig(**options))  # before the (slow) model load
    validate_prompt(args.prompt)
    models = explorer.load_models(args.preset, device=args.device, dtype=args.dtype, precision=args.precision)
    if args.verbose:
        print(f"explorer: {models_line(models)}", file=sys.stderr)
    trace = explorer.decode(args.method, models, args.prompt, **options)
    if args.json:
        out = trace.to_dict()
        if not args.events:
            out.pop("events")
        print(json.dumps(out, default=_json_default))
    else:
        print(trace.text)
        print(json.dumps(trace.stats, default=_json_default), file=sys.stderr)
    return 0


def models_line(models) -> str:
    """What runs: the preset, the target's precision (with the measurement that chose it) and the kernel path."""
    if models.precision_choice is not None:
        precision = models.precision_choice.line()
    elif models.precision is not None:
        precision = f"{models.precision} (asked for; {kernels.describe()})"
    else:
        precision = f"{str(models.dtype).replace('torch.', '')} (torch's kernels)"
    measured = choice.speculative_defaults(models, torch.get_num_threads())  # at the count the decode runs at
    spec = f"; {measured.line()}" if measured is not None else ""
    return f"preset {models.preset.name} on {models.device}; target precision {precision}{spec}"


def run_audit_command(args: argparse.Namespace) -> int:
    from explorer.measure.audit import report_lines, run_audit  # deferred: scipy (~1 s) via explorer.measure.audit

    if args.samples is not None and args.samples < 10:
        raise ExplorerError("--samples must be at least 10")
    if not 10 <= args.max_samples <= 1_000_000:
        raise ExplorerError("--max-samples must be between 10 and 1000000")
    if not 1 <= args.prefix_tokens <= 4:
        raise ExplorerError("--prefix-tokens must be between 1 and 4")
    options = _options(args, AUDIT_OPTIONS)
    options.setdefault("temperature", 1.0)
    validate("speculative", DecodeConfig(**options))
    validate_prompt(args.prompt)
    models = explorer.load_models(args.preset, device=args.device, dtype=args.dtype, precision=args.precision)
    result = run_audit(models, args.prompt, samples=args.samples, prefix_tokens=args.prefix_tokens,
                       until_detectable=args.until_detectable, max_samples=args.max_samples, control=args.control,
                       progress=_progress, **options)
    if args.json:
        print(json.dumps(result.as_dict(), default=_json_default))
    else:
        print("\n".join(report_lines(result)))
    return {"PASS": 0, "FAIL": 1}.get(result.status, 3)


def _progress(done: int, total: int) -> None:
    """Progress on stderr, about every 10%."""
    if done == total or done % max(1, total // 10) == 0:
        print(f"audit: {done}/{total} samples", file=sys.stderr, flush=True)


def run_loadtest(args: argparse.Namespace) -> int:
    from explorer.measure.loadtest import (  # deferred: gradio (~2.5 s) via explorer.measure.loadtest
        require_loopback,
        run_load,
    )

    if not 1 <= args.clients <= 64 or not 1 <= args.runs <= 10_000:
        raise ExplorerError("--clients must be 1..64 and --runs 1..10000")
    if args.url:
        require_loopback(args.url)
    report = run_load(args.clients, args.runs, args.preset, args.url, args.max_new_tokens, args.soak)
    summary = report.summary()
    if args.json:
        print(json.dumps(summary, default=_json_default))
    else:
        for key, value in summary.items():
            print(f"{key:18s} {value:.3f}" if isinstance(value, float) else f"{key:18s} {value}")
        for error in report.errors[:5]:
            print(f"  {error}")
    return 0 if not report.errors and not report.crossed else 1


def _json_default(obj):
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return str(obj)


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        if args.command == "decode":
            return run_decode(args)
        if args.command == "audit":
            return run_audit_command(args)
        if args.command == "loadtest":
            return run_loadtest(args)
        if args.command == "engine":
            return engine_commands.run(args)
        if args.command == "decide":
            return decide_cli.run(args)
        if args.command == "deploy-space":
            return deploy_space(args.repo, args.dry_run, args.out, args.private)
        return bench_cli.run(args)
    except ExplorerError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130
