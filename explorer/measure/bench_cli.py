"""``python -m explorer bench``: its flags, the checks before the model load, the run of the chosen parts and
their printed, CSV and HTML output. The method is described in ``explorer.measure.bench``."""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import sys
import time
from pathlib import Path

import pandas as pd
import torch

import explorer
from explorer.decoding.config import METHODS, DecodeConfig, validate
from explorer.errors import ExplorerError
from explorer.flags import add_model_arguments, add_option_arguments, option_help
from explorer.measure.bench import BATCHES, SWEEPS, BenchSettings, RunConfig, decode_options, format_summary
from explorer.measure.costs import batch_section, memory_section
from explorer.measure.peer import peer_section
from explorer.measure.report import (
    Section,
    write_report,
)
from explorer.measure.sweeps import bench_note, bench_section, cache_section, diffusion_section, sweep_section
from explorer.measure.workload import PromptSet, load_prompt_sets
from explorer.runtime import Models

# ---------------------------------------------------------------------------------------------
# the command line

def add_arguments(p: argparse.ArgumentParser) -> None:
    """Flags of ``python -m explorer bench`` (the CLI adds only the subcommand)."""
    add_model_arguments(p)
    p.add_argument("--prompts", default="code",
                   help="shipped set(s) (code, code_edit, prose, multilingual, high_temperature) or file(s), "
                        "comma-separated; a file holds one prompt a line or JSONL {prompt, temperature, id}")
    p.add_argument("--limit", type=int, default=None, help="use the first N prompts of each set")
    p.add_argument("--methods", default=",".join(METHODS), help=f"comma-separated: {', '.join(METHODS)}")
    p.add_argument("--repeats", type=int, default=1, help="timed requests per prompt and config")
    p.add_argument("--warmup", type=int, default=1, help="unrecorded requests per config before timing")
    add_option_arguments(p, ["max_new_tokens", "temperature"], defaults=True)
    add_option_arguments(p, ["gamma"])
    p.add_argument("--drafter", default=BenchSettings.drafter, help=option_help("drafter", BenchSettings.drafter))
    add_option_arguments(p, ["steps", "block_length", "cache"])
    add_option_arguments(p, ["seed"], defaults=True)
    p.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's choice)")
    p.add_argument("--ignore-eos", action="store_true", help="decode exactly max_new_tokens (as vLLM's --ignore-eos)")
    p.add_argument("--no-quality", action="store_true", help="skip perplexity and entropy scoring")
    p.add_argument("--sweep", default=None,
                   help=f"comma-separated: {', '.join(SWEEPS)} (runs these instead of the plain bench; "
                        "include 'bench' to run it too)")
    p.add_argument("--peer", action="store_true", help="also compare with transformers' generate (greedy)")
    p.add_argument("--csv", default=None, help="request rows; other parts go to <stem>.<part>.csv")
    p.add_argument("--report", default=None, help="write one self-contained HTML page with every figure")


def settings_from_args(args: argparse.Namespace) -> BenchSettings:
    return BenchSettings(max_new_tokens=args.max_new_tokens, temperature=args.temperature, gamma=args.gamma,
                    drafter=args.drafter, steps=args.steps, block_length=args.block_length, cache=args.cache,
                    seed=args.seed,
                    repeats=args.repeats, warmup=args.warmup, ignore_eos=args.ignore_eos,
                    quality=not args.no_quality, progress=True)


def check_args(args: argparse.Namespace) -> tuple[list[str], list[str]]:
    """Validate everything before the (slow) model load; return the methods and the parts to run."""
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    bad = [m for m in methods if m not in METHODS]
    if not methods or bad:
        raise ExplorerError(f"unknown method(s) {', '.join(bad) or '(none given)'}; choose from {', '.join(METHODS)}")
    parts = [w.strip() for w in (args.sweep or "bench").split(",") if w.strip()]
    bad = [w for w in parts if w not in SWEEPS]
    if not parts or bad:
        raise ExplorerError(f"unknown sweep(s) {', '.join(bad) or '(none given)'}; choose from {', '.join(SWEEPS)}")
    if args.repeats < 1 or args.warmup < 0:
        raise ExplorerError("--repeats must be >= 1 and --warmup >= 0")
    if args.threads is not None and args.threads < 1:
        raise ExplorerError("--threads must be >= 1")
    for out in filter(None, [args.csv, args.report]):
        try:
            Path(out).parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ExplorerError(f"cannot write {out}: {exc.strerror}") from None
    s = settings_from_args(args)
    for method in methods:
        options = {k: v for k, v in decode_options(RunConfig(method, method), s, None, 0).items() if v is not None}
        validate(method, DecodeConfig(**options))
    return methods, parts


def check_models(models: Models, methods: list[str], s: BenchSettings) -> None:
    """Fail before the first request when the preset lacks a model the run needs."""
    if "speculative" in methods and s.drafter == "model" and models.draft is None:
        raise ExplorerError(f"preset {models.preset.name!r} has no draft model; use --drafter prompt_lookup or "
                            "early_exit")
    if "diffusion" in methods and models.diffusion is None:
        raise ExplorerError(f"preset {models.preset.name!r} has no diffusion model; drop it from --methods")


def load_average() -> str:
    return " ".join(f"{v:.2f}" for v in os.getloadavg()) if hasattr(os, "getloadavg") else "n/a"


def machine_header(models: Models, sets: list[PromptSet], s: BenchSettings, parts: list[str],
                   load_at_start: str = "n/a") -> dict[str, str]:
    weights = models.memory_bytes()
    return {
        "machine": f"{cpu_name()}, {os.cpu_count()} logical CPUs, torch threads {torch.get_num_threads()}, "
                   f"{platform.system()} {platform.release()}",
        "load average (1, 5, 15 min)": f"at start {load_at_start}; at end {load_average()} (other work on the "
                                        "machine inflates and spreads the latencies)",
        "device": str(models.device) + (f" ({torch.cuda.get_device_name(models.device)})"
                                        if models.device.type == "cuda" else ""),
        "dtype": str(models.dtype).replace("torch.", ""),
        "precision": models.precision or str(models.dtype).replace("torch.", ""),
        "batch size": "1 (one request at a time)" + ("; the batch sweep times B = " + ", ".join(map(str, BATCHES))
                                                     if "batch" in parts else ""),
        "preset": models.preset.name,
        "models": "; ".join(f"{k}: {v} ({weights.get(k, 0) / 2**20:.1f} MiB)" for k, v in models.names.items()),
        "prompt sets": "; ".join(f"{ps.name} ({len(ps.prompts)} prompts, {ps.source})" for ps in sets),
        "parts": ", ".join(parts),
        "settings": bench_note(s),
        "versions": f"torch {torch.__version__}, transformers {__import__('transformers').__version__}, "
                    f"python {platform.python_version()}",
        "command": " ".join(["python -m explorer"] + sys.argv[1:]) if sys.argv and "explorer" in sys.argv[0] else "",
        "date (UTC)": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
    }


def cpu_name() -> str:
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown CPU"


def run(args: argparse.Namespace) -> int:
    """The ``bench`` subcommand: run the parts, print their tables, write CSV and the report."""
    methods, parts = check_args(args)
    sets = load_prompt_sets(args.prompts, args.limit)
    for ps in sets:
        if ps.notice:
            print(f"notice: {ps.notice}", file=sys.stderr)
    s = settings_from_args(args)
    if args.threads:
        torch.set_num_threads(args.threads)
    load_at_start = load_average()
    models = explorer.load_models(args.preset, device=args.device, dtype=args.dtype, precision=args.precision)
    check_models(models, methods if "bench" in parts else [], s)
    sections, frames, acceptance = [], {}, None
    for part in parts:
        if part == "bench":
            section, frame = bench_section(models, sets, methods, s)
            spec = frame[(frame["method"] == "speculative") & (frame["drafter"] == "model")]
            if len(spec) and spec["proposed"].sum():
                acceptance = spec["accepted"].sum() / spec["proposed"].sum()
        elif part in ("gamma", "temperature", "drafter", "drafter_gamma"):
            section, frame = sweep_section(part, models, sets, s)
        elif part == "diffusion":
            section, frame = diffusion_section(models, sets, s)
        elif part == "cache":
            section, frame = cache_section(models, sets, s)
        elif part == "batch":
            section, frame = batch_section(models, sets, s, acceptance)
        else:
            section, frame = memory_section(models)
        print_section(section)
        sections.append(section)
        frames[part] = frame
    if args.peer:
        section, frames["peer"] = peer_section(models, sets, s)
        print_section(section)
        sections.append(section)
    try:
        written = write_csvs(args.csv, frames) if args.csv else []
        if args.report:
            header = machine_header(models, sets, s, parts + ["peer"] * args.peer, load_at_start)
            written.append(write_report(args.report, header, sections))
    except OSError as exc:
        raise ExplorerError(f"cannot write the results: {exc}") from None
    for path in written:
        print(f"wrote {path}", file=sys.stderr)
    print(f"load average at start {load_at_start}, at end {load_average()}", file=sys.stderr)
    return 0


def print_section(section: Section) -> None:
    print(f"\n== {section.title}")
    for name, table in section.tables.items():
        print(f"-- {name}")
        print(format_summary(table) if {"prompt_set", "config", "requests"} <= set(table) else
              table.to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    for note in section.notes:
        print(f"note: {note}")


def write_csvs(path: str, frames: dict[str, pd.DataFrame]) -> list[Path]:
    """The first part's rows to ``path``; every other part's to ``<stem>.<part>.csv`` beside it."""
    path, written = Path(path), []
    for i, (part, frame) in enumerate(frames.items()):
        target = path if i == 0 else path.with_name(f"{path.stem}.{part}{path.suffix or '.csv'}")
        frame.drop(columns=["itl_s", "token_ids"], errors="ignore").to_csv(target, index=False)
        written.append(target)
    return written
