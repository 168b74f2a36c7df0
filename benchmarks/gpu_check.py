"""The device check of issue 26: one short run on a lent GPU (or ``--device cpu`` for a dry run or the CPU baseline).

    python benchmarks/gpu_check.py [--device cuda] [--out gpu_check.json] [--md gpu_check.md] [--budget 360]
        [--presets smollm2-135m,tiny,random-gemma4] [--tokens 32] [--prompts 3] [--audit-samples 3000]
        [--audit-max-s 90] [--skip audit,bf16] [--cpu-baseline cpu.json] [--threads N]

For each preset (smollm2-135m from the GGUF that ``smollm2_gguf_path()`` finds, EXPLORER_SMOLLM2_GGUF on the GPU
machine; tiny; the random-gemma4 miniatures):

* greedy speculative == autoregressive, token for token, for each of the preset's drafters on a few prompts (where
  they differ: the first differing position and the target's top-2 logit gap there, to tell a near tie from a bug);
* the diffusion lane decodes (tokens, passes);
* smollm2-135m: the losslessness audit at T = 0.7 (prompt "Tell me about tea.", top-k 8, gamma 3, the EAGLE head), its
  sample count cut to what fits ``--audit-max-s``;
* smollm2-135m and tiny loaded in bfloat16: greedy speculative == autoregressive again (a difference is "differs",
  not "fail": bfloat16 rounds a verify pass over gamma + 1 rows unlike a one-token pass, as on a CPU; the top-2 gap
  at the first differing token tells a near tie from a bug);
* tokens per second of every lane, against the same lanes of a CPU run (``--cpu-baseline``, a JSON this script wrote
  with ``--device cpu``), and whether the greedy autoregressive tokens are the CPU's.

Every check is wrapped: a failure or an exception is recorded and the rest still run. A check whose estimated time
does not fit what is left of ``--budget`` is skipped and says so. The JSON and the markdown table are rewritten after
every check, so a run stopped from outside still leaves its report. Exit status 1 when a check failed or raised.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import explorer  # noqa: E402
from explorer.families.smollm2 import smollm2_gguf_path  # noqa: E402

PROMPTS = [
    "def add(a, b):\n    return a + b\n\ndef add(a, b):",  # repeats itself: prompt lookup has something to draft
    "Write a Python function that returns the n-th Fibonacci number.",
    "Explain in two sentences what a hash table is.",
    "def parse(line):",
]
# The drafters each preset is checked with, and its audit (smollm2-135m: BENCHMARKS.md's Exactness audit, T = 0.7).
DRAFTERS = {
    "smollm2-135m": ("assistant", "model", "prompt_lookup"),
    "tiny": ("model", "prompt_lookup", "early_exit"),
    "random-gemma4": ("assistant",),
    "random-tiny": ("model", "prompt_lookup", "early_exit", "assistant"),
}
AUDIT = {
    "smollm2-135m": {"prompt": "Tell me about tea.", "top_k": 8, "gamma": 3, "drafter": "assistant"},
    "random-tiny": {"prompt": PROMPTS[3], "top_k": 8, "gamma": 3, "drafter": "model"},
}
PRESET_PROMPTS = {"random-gemma4": ["def parse(line):", "The quick brown fox", "x = [i for i in"]}  # test_gemma's
BF16 = ("smollm2-135m", "tiny", "random-tiny")
DEFAULT_PRESETS = ("smollm2-135m", "tiny", "random-gemma4")
LOAD_ESTIMATE_S = {"smollm2-135m": 20.0}  # dequantizing the GGUF; other presets load in a few seconds
AUDIT_TEMPERATURE = 0.7
FAILING = ("fail", "error")


# ---------------------------------------------------------------------------------------------- the report

class Report:
    """Checks in the order they ran, lane timings, and the greedy AR tokens (for the next run's CPU comparison)."""

    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.t0 = time.monotonic()
        self.checks: list[dict[str, Any]] = []
        self.timings: dict[str, dict[str, float]] = {}
        self.ar_tokens: dict[str, dict[str, list[int]]] = {}
        self.baseline = json.loads(Path(args.cpu_baseline).read_text()) if args.cpu_baseline else None
        self.env = environment(args.device)

    def remaining(self) -> float:
        return self.args.budget - (time.monotonic() - self.t0)

    def run(self, name: str, preset: str, dtype: str, fn: Callable[[], tuple[str, dict, str]],
            estimate: float = 0.0) -> str:
        """Run one check unless it does not fit the budget; record its status, detail and one-line summary."""
        left = self.remaining()
        if left < max(estimate, 1.0):
            status, detail, summary = "skipped", {}, f"needs about {estimate:.0f} s, {max(left, 0):.0f} s of the " \
                                                       f"{self.args.budget:.0f} s budget left"
            seconds = 0.0
        else:
            start = time.monotonic()
            try:
                status, detail, summary = fn()
            except Exception as exc:  # recorded; the other checks still run
                status, summary = "error", f"{type(exc).__name__}: {exc}"[:300]
                detail = {"traceback": traceback.format_exc().splitlines()[-8:]}
            seconds = time.monotonic() - start
        self.checks.append({"name": name, "preset": preset, "dtype": dtype, "status": status,
                            "seconds": round(seconds, 2), "summary": summary, "detail": detail})
        print(f"[{time.monotonic() - self.t0:6.1f} s] {status.upper():12s} {preset} {dtype} {name}: {summary}",
              flush=True)
        self.save()
        return status

    def add_timing(self, key: str, trace: explorer.Trace) -> None:
        t = self.timings.setdefault(key, {"tokens": 0, "wall_s": 0.0, "decodes": 0})
        t["tokens"] += trace.stats["new_tokens"]
        t["wall_s"] += trace.stats["wall_s"]
        t["decodes"] += 1
        t["tokens_per_s"] = t["tokens"] / t["wall_s"] if t["wall_s"] > 0 else None

    def as_dict(self) -> dict[str, Any]:
        counts: dict[str, int] = {}
        for c in self.checks:
            counts[c["status"]] = counts.get(c["status"], 0) + 1
        return {"env": self.env, "budget_s": self.args.budget, "elapsed_s": round(time.monotonic() - self.t0, 1),
                "settings": {"tokens": self.args.tokens, "prompts": self.args.prompts,
                             "audit_samples": self.args.audit_samples, "audit_max_s": self.args.audit_max_s,
                             "presets": self.args.presets, "skip": self.args.skip},
                "counts": counts, "checks": self.checks, "timings": self.timings, "ar_tokens": self.ar_tokens,
                "cpu_baseline": None if self.baseline is None else self.baseline.get("env")}

    def save(self) -> None:
        Path(self.args.out).write_text(json.dumps(self.as_dict(), indent=1, default=str) + "\n")
        if self.args.md:
            Path(self.args.md).write_text(markdown(self.as_dict(), self.baseline))


def environment(device: str) -> dict[str, Any]:
    import transformers

    env = {"date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
           "python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__,
           "device": device,
           "torch_threads": torch.get_num_threads(), "cpu": platform.processor() or platform.machine()}
    for mod in ("tokenizers", "gguf", "peft"):
        try:
            env[mod] = getattr(__import__(mod), "__version__", "installed")
        except ImportError:
            env[mod] = None
    if device.startswith("cuda") and torch.cuda.is_available():
        env["gpu"] = torch.cuda.get_device_name(0)
        env["cuda"] = torch.version.cuda
    try:
        env["smollm2_gguf"] = str(smollm2_gguf_path())
    except explorer.ExplorerError as exc:
        env["smollm2_gguf"] = f"none: {exc}"
    return env


def markdown(report: dict, baseline: dict | None) -> str:
    env = report["env"]
    where = env.get("gpu") or f"CPU ({env['cpu']}, {env['torch_threads']} threads)"
    lines = ["# Device check (`benchmarks/gpu_check.py`)", "",
             f"{where}; torch {env['torch']}, transformers {env['transformers']}; {env['date']}; "
             f"{report['elapsed_s']} s of a {report['budget_s']:.0f} s budget; "
             + ", ".join(f"{n} {s}" for s, n in sorted(report["counts"].items())) + ".", "",
             "| check | preset | dtype | status | s | result |", "| --- | --- | --- | --- | ---: | --- |"]
    lines += [f"| {c['name']} | {c['preset']} | {c['dtype']} | {c['status']} | {c['seconds']:.1f} | "
              f"{c['summary'].replace('|', '/')} |" for c in report["checks"]]
    if report["timings"]:
        base = (baseline or {}).get("timings", {})
        other = "CPU baseline" if baseline else "CPU baseline (none given)"
        lines += ["", f"Tokens per second (greedy, {report['settings']['tokens']} new tokens, batch 1, summed over "
                  "the prompts):", "", f"| preset / dtype / lane | this device | {other} | ratio |",
                  "| --- | ---: | ---: | ---: |"]
        for key, t in report["timings"].items():
            b = base.get(key, {}).get("tokens_per_s")
            mine = t.get("tokens_per_s")
            ratio = f"{mine / b:.2f}x" if mine and b else "-"
            lines.append(f"| {key} | {_num(mine)} | {_num(b)} | {ratio} |")
        if baseline:
            benv = baseline.get("env", {})
            lines += ["", f"CPU baseline: {benv.get('cpu')}, {benv.get('torch_threads')} threads, torch "
                      f"{benv.get('torch')}, {benv.get('date')}."]
    return "\n".join(lines) + "\n"


def _num(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f}"


# ---------------------------------------------------------------------------------------------- the checks

def first_divergence(models: explorer.Models, ar: explorer.Trace, spec: explorer.Trace) -> dict[str, Any]:
    """Where speculative first left autoregressive, and the target's top-2 logit gap there (a near tie is
    numerics; a wide gap is a bug)."""
    a, s = ar.token_ids, spec.token_ids
    i = next((k for k, (x, y) in enumerate(zip(a, s, strict=False)) if x != y), min(len(a), len(s)))
    out: dict[str, Any] = {"first_divergence": i, "ar_token": a[i] if i < len(a) else None,
                           "spec_token": s[i] if i < len(s) else None}
    ids = torch.tensor([ar.prompt_ids + a[:i]], device=models.device)
    with torch.inference_mode():
        logits = models.target(input_ids=ids).logits[0, -1].float()
    top = logits.topk(2).values
    out["top2_logit_gap"] = round(float(top[0] - top[1]), 6)
    return out


class PresetRun:
    """One preset loaded at one dtype, and its greedy AR traces (shared by the drafters' comparisons)."""

    def __init__(self, report: Report, name: str, dtype: str):
        self.report, self.name, self.dtype = report, name, dtype
        self.models: explorer.Models | None = None
        self.ar: dict[int, explorer.Trace] = {}
        self.unit_s = 1.0  # seconds of one greedy AR decode of --tokens tokens (measured after loading)
        args = report.args
        self.n = args.tokens
        self.prompts = PRESET_PROMPTS.get(name, PROMPTS)[: args.prompts]

    @property
    def key(self) -> str:
        return f"{self.name}/{self.dtype}"

    def load(self) -> tuple[str, dict, str]:
        start = time.perf_counter()
        self.models = m = explorer.load_models(self.name, device=self.report.args.device, dtype=self.dtype)
        load_s = time.perf_counter() - start
        explorer.decode("autoregressive", m, self.prompts[0], max_new_tokens=4)  # warm-up (CUDA context, kernels)
        self.unit_s = self.ar_trace(0).stats["wall_s"]
        memory = {k: round(v / 2**20, 1) for k, v in m.memory_bytes().items()}
        return "pass", {"load_s": round(load_s, 2), "names": m.names, "memory_mib": memory, "device": str(m.device)}, \
            f"loaded in {load_s:.1f} s on {m.device}; one AR decode of {self.n} tokens {self.unit_s:.2f} s"

    def ar_trace(self, i: int) -> explorer.Trace:
        if i not in self.ar:
            self.ar[i] = explorer.decode("autoregressive", self.models, self.prompts[i], max_new_tokens=self.n)
            self.report.add_timing(f"{self.key}/autoregressive", self.ar[i])
            self.report.ar_tokens.setdefault(self.key, {})[str(i)] = self.ar[i].token_ids
        return self.ar[i]

    def speculative_equals_ar(self, drafter: str) -> tuple[str, dict, str]:
        m = self.models
        explorer.decode("speculative", m, self.prompts[0], max_new_tokens=4, drafter=drafter)  # warm-up
        rows, accepted, proposed, tokens, passes = [], 0, 0, 0, 0
        for i, prompt in enumerate(self.prompts):
            ar = self.ar_trace(i)
            spec = explorer.decode("speculative", m, prompt, max_new_tokens=self.n, drafter=drafter)
            self.report.add_timing(f"{self.key}/speculative:{drafter}", spec)
            row = {"prompt": i, "equal": spec.token_ids == ar.token_ids, "tokens": len(spec.token_ids),
                   "acceptance": spec.stats["acceptance_rate"]}
            if not row["equal"]:
                row.update(first_divergence(m, ar, spec))
            rows.append(row)
            accepted, proposed = accepted + spec.stats["accepted"], proposed + spec.stats["proposed"]
            tokens, passes = tokens + len(spec.token_ids), passes + spec.stats["target_forward_passes"]
        equal = sum(r["equal"] for r in rows)
        summary = (f"{equal}/{len(rows)} prompts token for token; acceptance "
                   f"{accepted / proposed if proposed else 0:.2f}, {tokens / max(passes, 1):.2f} tokens per target "
                   "pass")
        bad = [r for r in rows if not r["equal"]]
        if bad:
            summary += "; first differs at " + ", ".join(
                f"prompt {r['prompt']} token {r['first_divergence']} (top-2 gap {r['top2_logit_gap']:.3g})"
                for r in bad)
        if not bad:
            return "pass", {"rows": rows}, summary
        if self.dtype != "float32":  # not row-invariant: a verify pass over gamma + 1 rows rounds unlike one row
            return "differs", {"rows": rows}, summary + f" ({self.dtype} rounds a verify pass and a one-token pass " \
                "differently: a flip at a near tie is numerics; float32 must be equal)"
        return "fail", {"rows": rows}, summary

    def diffusion_options(self) -> dict[str, Any]:
        from explorer.families.gemma import is_diffusion_gemma

        if is_diffusion_gemma(self.models.diffusion):  # its own canvas and steps; 16 tokens = two canvases
            return {"max_new_tokens": min(self.n, 16)}
        p = self.models.preset  # the app's defaults: tokens per pass and blocks
        blocks = p.diffusion_blocks if self.n % p.diffusion_blocks == 0 else 1
        steps = max(blocks, self.n // p.diffusion_tokens_per_step // blocks * blocks)
        return {"max_new_tokens": self.n, "steps": steps, "block_length": self.n // blocks}

    def diffusion_decodes(self) -> tuple[str, dict, str]:
        m, options = self.models, self.diffusion_options()
        explorer.decode("diffusion", m, self.prompts[0], **options)  # warm-up
        rows = []
        for i, prompt in enumerate(self.prompts):
            t = explorer.decode("diffusion", m, prompt, **options)
            self.report.add_timing(f"{self.key}/diffusion", t)
            rows.append({"prompt": i, "tokens": len(t.token_ids), "passes": t.stats["target_forward_passes"],
                         "tokens_per_s": t.stats["tokens_per_s"], "text": t.text[:80]})
        ok = all(r["tokens"] > 0 and r["passes"] > 0 for r in rows)
        summary = (f"{len(rows)} prompts: tokens {[r['tokens'] for r in rows]}, passes {[r['passes'] for r in rows]} "
                   f"({', '.join(f'{k}={v}' for k, v in options.items())})")
        return ("pass" if ok else "fail"), {"options": options, "rows": rows}, summary

    def audit(self) -> tuple[str, dict, str]:
        from explorer.measure.audit import plan_audit, run_audit

        m, spec = self.models, AUDIT[self.name]
        options = {"temperature": AUDIT_TEMPERATURE, "top_k": spec["top_k"], "gamma": spec["gamma"],
                   "drafter": spec["drafter"]}
        start = time.perf_counter()
        plan = plan_audit(m, spec["prompt"], 2, None, **options)  # the exact distributions: run_audit repeats it
        plan_s = time.perf_counter() - start
        start = time.perf_counter()
        for seed in range(3):
            explorer.decode("speculative", m, spec["prompt"], max_new_tokens=3, seed=seed, **options)
        per_sample = (time.perf_counter() - start) / 3 * (2 if plan.control else 1) * 1.2
        allot = min(self.report.args.audit_max_s, self.report.remaining() - 5) - plan_s
        samples = min(self.report.args.audit_samples, int(max(allot, 0) / per_sample))
        if samples < 10:
            return "skipped", {"per_sample_s": per_sample, "plan_s": plan_s}, \
                f"{per_sample:.3f} s a sample after {plan_s:.1f} s of planning: fewer than 10 fit the budget"
        result = run_audit(m, spec["prompt"], samples=samples, prefix_tokens=2, **options)
        detail = {"prompt": spec["prompt"], **options, "samples": result.samples, "verdict": result.verdict,
                  "acceptance": result.acceptance_rate, "samples_needed": result.samples_needed,
                  "tests": [{"name": t["name"], "p_value": t["p_value"]} for t in result.tests]}
        cut = "" if samples == self.report.args.audit_samples else f" (cut from {self.report.args.audit_samples} " \
                                                                  "to fit the budget)"
        summary = (f"{result.status} at T = {AUDIT_TEMPERATURE}, top-k {spec['top_k']}, gamma {spec['gamma']}, "
                   f"{spec['drafter']}: {result.samples} samples{cut}, acceptance {result.acceptance_rate:.2f}, "
                   + ", ".join(f"p = {t['p_value']:.3g}" for t in result.tests)
                   + (f"; {result.samples_needed} samples would make every known bug detectable"
                      if result.status == "INCONCLUSIVE" and result.samples_needed else ""))
        return result.status.lower(), detail, summary


def check_preset(report: Report, name: str, dtype: str, parts: list[str]) -> None:
    run = PresetRun(report, name, dtype)
    if report.run("load", name, dtype, run.load, LOAD_ESTIMATE_S.get(name, 3.0)) != "pass":
        return
    n = len(run.prompts)
    if "spec" in parts:
        for drafter in DRAFTERS[name]:
            report.run(f"speculative == autoregressive ({drafter})", name, dtype,
                       lambda d=drafter: run.speculative_equals_ar(d), estimate=2 * n * run.unit_s)
    if "diffusion" in parts:
        report.run("diffusion lane decodes", name, dtype, run.diffusion_decodes, estimate=(n + 1) * run.unit_s)
    if "audit" in parts and name in AUDIT:
        report.run(f"audit at T = {AUDIT_TEMPERATURE}", name, dtype, run.audit, estimate=10 * run.unit_s)


def compare_with_cpu(report: Report) -> None:
    """Greedy AR tokens here against the CPU baseline's, prompt by prompt (float32; other devices may round a near
    tie the other way: a difference is reported, not failed)."""
    base = report.baseline.get("ar_tokens", {})
    for key, mine in report.ar_tokens.items():
        if key not in base:
            continue
        same = [i for i in mine if i in base[key] and base[key][i] == mine[i]]
        shared = [i for i in mine if i in base[key]]
        name, dtype = key.split("/")

        def fn(same=same, shared=shared):
            return ("pass" if len(same) == len(shared) else "differs"), {"same": same, "compared": shared}, \
                f"{len(same)}/{len(shared)} prompts give the CPU's greedy tokens"

        report.run("AR tokens equal the CPU baseline's", name, dtype, fn)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda", help="cuda (the check), cpu (a dry run or the CPU baseline)")
    parser.add_argument("--out", default="gpu_check.json")
    parser.add_argument("--md", default=None, help="the markdown table (default: --out with .md)")
    parser.add_argument("--budget", type=float, default=360.0, help="seconds the checks may take in all")
    parser.add_argument("--presets", default=",".join(DEFAULT_PRESETS))
    parser.add_argument("--tokens", type=int, default=32, help="new tokens per decode")
    parser.add_argument("--prompts", type=int, default=3, help=f"prompts per check, 1..{len(PROMPTS)}")
    parser.add_argument("--audit-samples", type=int, default=3000, help="at most; cut to fit --audit-max-s")
    parser.add_argument("--audit-max-s", type=float, default=90.0)
    parser.add_argument("--skip", default="", help="comma list of: spec, diffusion, audit, bf16")
    parser.add_argument("--cpu-baseline", default=None, help="a JSON this script wrote with --device cpu")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (CPU runs)")
    args = parser.parse_args(argv)
    if not 1 <= args.prompts <= len(PROMPTS):
        parser.error(f"--prompts must be 1..{len(PROMPTS)}")
    args.md = args.md if args.md is not None else str(Path(args.out).with_suffix(".md"))
    if args.threads:
        torch.set_num_threads(args.threads)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    presets = [p for p in args.presets.split(",") if p]
    unknown = [p for p in presets if p not in DRAFTERS]
    if unknown:
        parser.error(f"no checks defined for {unknown}; choose from {', '.join(DRAFTERS)}")
    skip = {s for s in args.skip.split(",") if s}
    parts = [p for p in ("spec", "diffusion", "audit") if p not in skip]
    report = Report(args)
    report.save()
    for name in presets:  # float32 first: every preset's lanes, the audit with the default preset
        check_preset(report, name, "float32", parts)
    if "bf16" not in skip:
        for name in presets:
            if name in BF16:
                check_preset(report, name, "bfloat16", [p for p in parts if p in ("spec", "diffusion")])
    if report.baseline is not None:
        compare_with_cpu(report)
    report.save()
    failed = [c for c in report.checks if c["status"] in FAILING]
    print(f"{len(report.checks)} checks, {len(failed)} failed; report: {args.out}, {args.md}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
