"""The prepared device check (issue 26): benchmarks/gpu_check.py in its smallest configuration on random-tiny (CPU,
seconds), the planning and the staging of scripts/gpu_plan.py, and EXPLORER_SMOLLM2_GGUF."""

import importlib.util
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

import explorer
from explorer.families.smollm2 import smollm2_gguf_path

ROOT = Path(__file__).resolve().parent.parent
MiB = 2**20


def _module(path: str, name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


gpu_check = _module("benchmarks/gpu_check.py", "gpu_check")
gpu_plan = _module("scripts/gpu_plan.py", "gpu_plan")
SMALLEST = ["--device", "cpu", "--presets", "random-tiny", "--tokens", "8", "--prompts", "1", "--audit-samples", "10",
            "--threads", "1"]


# ---------------------------------------------------------------------------------------------- the check

def test_the_smallest_check_runs_every_lane_on_random_tiny_and_compares_with_a_baseline(tmp_path):
    out = tmp_path / "cpu.json"
    assert gpu_check.main([*SMALLEST, "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    checks = {(c["name"], c["dtype"]): c["status"] for c in report["checks"]}
    for dtype in ("float32", "bfloat16"):
        assert checks[("load", dtype)] == "pass"
        assert checks[("diffusion lane decodes", dtype)] == "pass"
        for drafter in gpu_check.DRAFTERS["random-tiny"]:
            assert checks[(f"speculative == autoregressive ({drafter})", dtype)] == "pass"
    assert checks[("audit at T = 0.7", "float32")] in ("pass", "inconclusive")  # 10 samples: inconclusive
    assert report["timings"]["random-tiny/float32/autoregressive"]["tokens_per_s"] > 0
    assert "| speculative == autoregressive (assistant) | random-tiny | float32 | pass |" in \
        out.with_suffix(".md").read_text()

    again = tmp_path / "device.json"  # the same run against the first as its CPU baseline
    assert gpu_check.main([*SMALLEST, "--skip", "audit,bf16", "--cpu-baseline", str(out), "--out",
                           str(again)]) == 0
    report = json.loads(again.read_text())
    assert [c["status"] for c in report["checks"] if c["name"] == "AR tokens equal the CPU baseline's"] == ["pass"]
    assert not any(c["dtype"] == "bfloat16" or c["name"].startswith("audit") for c in report["checks"])
    md = again.with_suffix(".md").read_text()
    assert "| random-tiny/float32/autoregressive |" in md and "x |" in md  # a device / CPU ratio


def test_a_check_that_does_not_fit_the_budget_is_skipped_and_says_so(tmp_path):
    out = tmp_path / "r.json"
    assert gpu_check.main([*SMALLEST, "--budget", "0", "--out", str(out)]) == 0
    checks = json.loads(out.read_text())["checks"]
    assert checks and all(c["status"] == "skipped" and "budget" in c["summary"] for c in checks)


def test_a_check_that_raises_is_recorded_and_the_next_still_runs(tmp_path):
    args = gpu_check.argparse.Namespace(budget=60.0, out=str(tmp_path / "r.json"), md=None, cpu_baseline=None,
                                        device="cpu", tokens=8, prompts=1, audit_samples=10, audit_max_s=5,
                                        presets="random-tiny", skip="")
    report = gpu_check.Report(args)

    def boom():
        raise RuntimeError("Expected all tensors to be on the same device")

    assert report.run("broken", "random-tiny", "float32", boom) == "error"
    assert report.run("fine", "random-tiny", "float32", lambda: ("pass", {}, "ok")) == "pass"
    saved = json.loads(Path(args.out).read_text())["checks"]
    assert [c["status"] for c in saved] == ["error", "pass"] and "same device" in saved[0]["summary"]


# ---------------------------------------------------------------------------------------------- the plan

@pytest.mark.parametrize("tree_mib", [20, 40, 44])
def test_the_plan_fits_every_call_under_the_limit_in_the_fewest_calls(tree_mib):
    tree, gguf, extra = int(tree_mib * MiB), 98_362_432, int(16.9 * MiB)
    plan = gpu_plan.plan_calls(tree, gguf, extra)
    for call in plan.calls:
        assert tree + call.carried_bytes <= gpu_plan.LIMIT - gpu_plan.MARGIN
    assert plan.chunks[0].offset == 0 and sum(c.bytes for c in plan.chunks) == gguf
    assert all(a.offset + a.bytes == b.offset for a, b in zip(plan.chunks, plan.chunks[1:], strict=False))
    assert len(plan.calls) == math.ceil((gguf + extra) / plan.room)  # nothing wasted
    first, *_, final = plan.calls
    assert gpu_plan.WHEELS in first.carry and "--setup --stage 0" in first.command  # fails fast on a bad machine
    assert final.final and final.command.endswith("--run") and "--setup" not in final.command
    assert all(gpu_plan.WHEELS not in c.carry and gpu_plan.MANIFEST in c.carry for c in plan.calls[1:])
    assert [c.chunk for c in plan.calls] == list(range(len(plan.calls)))


def test_the_plan_follows_the_tree_and_refuses_a_tree_too_large():
    small, large = (gpu_plan.plan_calls(t * MiB, 98_362_432, 17 * MiB) for t in (10, 40))
    assert len(small.calls) < len(large.calls)
    one = gpu_plan.plan_calls(10 * MiB, 5 * MiB, 17 * MiB)  # everything fits one call
    assert [c.command for c in one.calls] == ["PYTHONUNBUFFERED=1 bash scripts/gpu_check.sh --setup --stage 0 --run"]
    with pytest.raises(gpu_plan.PlanError, match="Shrink the tree"):
        gpu_plan.plan_calls(114 * MiB, 98_362_432, 17 * MiB)


def test_split_stage_and_verify_assemble_the_file_and_refuse_a_lost_stage(tmp_path):
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(bytes(range(256)) * 40)  # 10240 bytes
    plan = gpu_plan.plan_calls(1000, gguf.stat().st_size, 1000, limit=6000, margin=0, fixed=0)
    assert len(plan.chunks) == len(plan.calls) == 3
    gpu_plan.split(gguf, plan, tmp_path)
    (tmp_path / gpu_plan.MANIFEST).write_text(json.dumps(gpu_plan.make_manifest(gguf, plan, [], False)))
    with pytest.raises(gpu_plan.PlanError, match="Start again at call 1"):
        gpu_plan.stage(tmp_path, 1)  # a fresh machine: stage 0 never ran here
    for k in range(3):
        target = gpu_plan.stage(tmp_path, k)
    gpu_plan.stage(tmp_path, 2)  # a repeated last stage is a no-op
    assert gpu_plan.verify(tmp_path).read_bytes() == gguf.read_bytes() == target.read_bytes()
    (tmp_path / plan.chunks[1].path).write_bytes(b"x" * plan.chunks[1].bytes)
    gpu_plan.stage(tmp_path, 0)
    with pytest.raises(gpu_plan.PlanError, match="damaged"):
        gpu_plan.stage(tmp_path, 1)


def test_the_tree_that_travels_counts_tracked_and_untracked_files_but_not_ignored_ones(tmp_path):
    def git(*args):
        subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True)

    git("init", "-q")
    (tmp_path / ".gitignore").write_text("/.gpu/\n")
    (tmp_path / "tracked.bin").write_bytes(b"a" * 1000)
    git("add", ".")
    (tmp_path / "untracked.txt").write_bytes(b"b" * 100)
    (tmp_path / ".gpu").mkdir()
    (tmp_path / ".gpu" / "big.part").write_bytes(b"c" * 5000)
    assert gpu_plan.tree_bytes(tmp_path) == 1000 + 100 + len("/.gpu/\n")


# ---------------------------------------------------------------------------------------------- the GGUF's path

def test_explorer_smollm2_gguf_names_the_target_file(tmp_path, monkeypatch):
    copy = tmp_path / "SmolLM2-135M-Instruct.Q4_1.gguf"
    copy.write_bytes(b"GGUF")
    monkeypatch.setenv("EXPLORER_SMOLLM2_GGUF", str(copy))
    assert smollm2_gguf_path() == copy.resolve()
    monkeypatch.setenv("EXPLORER_SMOLLM2_GGUF", str(tmp_path / "missing.gguf"))
    with pytest.raises(explorer.ExplorerError, match="EXPLORER_SMOLLM2_GGUF"):
        smollm2_gguf_path()
    with pytest.raises(explorer.ExplorerError, match="EXPLORER_SMOLLM2_GGUF"):  # not a silent fall back to the Hub
        explorer.load_models("smollm2-135m", device="cpu", dtype="float16")


@pytest.mark.parametrize("dtype, status", [("float32", "fail"), ("bfloat16", "differs")])
def test_a_speculative_output_that_parts_from_ar_fails_in_float32_and_differs_in_bfloat16(tmp_path, monkeypatch,
                                                                                           dtype, status):
    args = gpu_check.argparse.Namespace(budget=60.0, out=str(tmp_path / "r.json"), md=None, cpu_baseline=None,
                                        device="cpu", tokens=6, prompts=1, audit_samples=10, audit_max_s=5,
                                        presets="random-tiny", skip="")
    run = gpu_check.PresetRun(gpu_check.Report(args), "random-tiny", dtype)
    assert run.load()[0] == "pass"
    decode = explorer.decode

    def wrong_last_token(method, models, prompt, **options):
        trace = decode(method, models, prompt, **options)
        if method == "speculative":
            trace.token_ids = [*trace.token_ids[:-1], (trace.token_ids[-1] + 1) % 256]
        return trace

    monkeypatch.setattr(gpu_check.explorer, "decode", wrong_last_token)
    got, detail, summary = run.speculative_equals_ar("model")
    assert got == status and detail["rows"][0]["first_divergence"] == 5 and "top-2 gap" in summary
