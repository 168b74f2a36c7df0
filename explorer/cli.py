"""``python -m explorer decode | bench | audit`` (DESIGN.md, contract).

Bad input exits with status 2 and one clear line on stderr, never a traceback.
"""

from __future__ import annotations

import argparse
import json
import math
import sys

from explorer.errors import ExplorerError
from explorer.models import DEFAULT_PRESET


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, not usage + message
        raise ExplorerError(message)


def _add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--preset", default=DEFAULT_PRESET)
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default=None)
    p.add_argument("--prompt", required=True)
    p.add_argument("--max-new-tokens", type=int, default=None)
    p.add_argument("--temperature", type=float, default=None)
    p.add_argument("--top-k", type=int, default=None)
    p.add_argument("--top-p", type=float, default=None)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--gamma", type=int, default=None)
    p.add_argument("--drafter", default=None)
    p.add_argument("--adaptive-gamma", action="store_true", default=None)
    p.add_argument("--early-exit-layers", type=int, default=None)
    p.add_argument("--draft-passes", type=int, default=None, help="diffusion drafter: denoiser passes per draft")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="python -m explorer", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    d = sub.add_parser("decode", help="decode one prompt with one method")
    _add_common(d)
    d.add_argument("--method", required=True)
    d.add_argument("--steps", type=int, default=None)
    d.add_argument("--block-length", type=int, default=None)
    d.add_argument("--remasking", default=None)
    d.add_argument("--threshold", type=float, default=None)
    d.add_argument("--cache", default=None, help="diffusion KV cache: none, prefix or dual")
    d.add_argument("--json", action="store_true", help="print one JSON object (the trace)")
    d.add_argument("--events", action="store_true", help="with --json: include every event")
    a = sub.add_parser("audit", help="check that speculative sampling preserves the target distribution")
    _add_common(a)
    a.add_argument("--samples", type=int, default=None,
                   help="samples of the speculative decoder (default: as many as make the known bugs detectable)")
    a.add_argument("--until-detectable", action="store_true",
                   help="raise --samples to the count at which the known bugs are detectable (up to --max-samples)")
    a.add_argument("--max-samples", type=int, default=20_000)
    a.add_argument("--control", action="store_true", default=None,
                   help="also sample the autoregressive decoder (always done when the exact tests do not cover "
                        "every compared token)")
    a.add_argument("--prefix-tokens", type=int, default=2)
    a.add_argument("--json", action="store_true", help="print one JSON object; exit 0 PASS, 1 FAIL, 3 INCONCLUSIVE")
    lt = sub.add_parser("loadtest", help="drive the app with concurrent sessions on loopback; --soak for memory")
    lt.add_argument("--preset", default=DEFAULT_PRESET)
    lt.add_argument("--clients", type=int, default=8)
    lt.add_argument("--runs", type=int, default=3, help="runs per session")
    lt.add_argument("--max-new-tokens", type=int, default=16)
    lt.add_argument("--url", default=None, help="a running app on a loopback address (default: start one)")
    lt.add_argument("--soak", action="store_true", help="sample resident memory every 10 runs")
    lt.add_argument("--json", action="store_true")
    ds = sub.add_parser("deploy-space", help="build, check and upload the app as a Hugging Face Space")
    ds.add_argument("--repo", required=True, help="user/name of the Space (created if missing)")
    ds.add_argument("--dry-run", action="store_true", help="build and check the bundle only; upload nothing")
    ds.add_argument("--out", default=None, help="build the bundle in this folder (default: a temporary one)")
    ds.add_argument("--private", action="store_true")
    b = sub.add_parser("bench", help="run a workload and print p50/p95/p99")
    from explorer import bench

    bench.add_arguments(b)
    return parser


def _options(args: argparse.Namespace, names: list[str]) -> dict:
    return {n: getattr(args, n) for n in names if getattr(args, n, None) is not None}


DECODE_OPTIONS = ["max_new_tokens", "temperature", "top_k", "top_p", "seed", "gamma", "drafter", "adaptive_gamma",
                  "early_exit_layers", "draft_passes", "steps", "block_length", "remasking", "threshold", "cache"]


def run_decode(args: argparse.Namespace) -> int:
    import explorer
    from explorer.config import METHODS, validate, validate_prompt

    options = _options(args, DECODE_OPTIONS)
    if args.method not in METHODS:
        raise ExplorerError(f"unknown method {args.method!r}; choose one of {', '.join(METHODS)}")
    from explorer.config import DecodeConfig

    validate(args.method, DecodeConfig(**options))  # before the (slow) model load
    validate_prompt(args.prompt)
    models = explorer.load_models(args.preset, device=args.device, dtype=args.dtype)
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


def run_audit_command(args: argparse.Namespace) -> int:
    import explorer
    from explorer.audit import report_lines, run_audit

    if args.samples is not None and args.samples < 10:
        raise ExplorerError("--samples must be at least 10")
    if not 10 <= args.max_samples <= 1_000_000:
        raise ExplorerError("--max-samples must be between 10 and 1000000")
    if not 1 <= args.prefix_tokens <= 4:
        raise ExplorerError("--prefix-tokens must be between 1 and 4")
    options = _options(args, ["temperature", "top_k", "top_p", "seed", "gamma", "drafter", "early_exit_layers"])
    options.setdefault("temperature", 1.0)
    from explorer.config import DecodeConfig, validate, validate_prompt

    validate("speculative", DecodeConfig(**options))
    validate_prompt(args.prompt)
    models = explorer.load_models(args.preset, device=args.device, dtype=args.dtype)
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
    from explorer.loadtest import require_loopback, run_load

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
        if args.command == "deploy-space":
            from explorer.hosting import deploy_space

            return deploy_space(args.repo, args.dry_run, args.out, args.private)
        from explorer import bench

        return bench.run(args)
    except ExplorerError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130
