"""The row-invariant kernels on every SIMD path (explorer/precision/kernels.py, rowinv_simd.h): each path this machine
can build (AVX-512, AVX2 + FMA, portable; NEON cross-compiled and run under qemu where the tools are installed)
gives each row of a 1..16-row call the bits of its one-row call, for every kernel, and every path gives the same
bits as every other (rowinv_check.cpp, the kernels without torch). Then the switch that forces a path, and the
precision chosen by measurement (explorer/precision/choice.py).
"""

from __future__ import annotations

import os
import shutil
import time

import pytest
import torch

import explorer
from explorer.precision import AUTO, EXACT, choice, kernels, resolve_precision
from explorer.precision.exact import RowInvariantLinear

needs_compiler = pytest.mark.skipif(shutil.which("c++") is None, reason="no C++ compiler")
NATIVE = [isa for isa in kernels.cpu_isas() if isa != "amx"]  # AMX: the torch build only (test_eagle_tree.py)
CROSS = shutil.which("aarch64-linux-gnu-g++") is not None and shutil.which("qemu-aarch64") is not None


def digests(out: str) -> dict[str, str]:
    return dict(line.split()[:2] for line in out.splitlines() if line.split()[0] not in ("path", "every", "rows"))


@needs_compiler
@pytest.mark.parametrize("isa", NATIVE)
def test_every_path_this_machine_builds_keeps_each_row_bit_identical(isa):
    run = kernels.check_path(isa)
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.splitlines()[0] == f"path {isa}"
    assert "every row equals its one-row call" in run.stdout
    assert len(digests(run.stdout)) >= 14  # every kernel was checked


@needs_compiler
@pytest.mark.parametrize("isa", NATIVE)
def test_negative_control_the_check_catches_a_sum_whose_order_follows_the_row_count(isa):
    run = kernels.check_path(isa, False, "--negative")
    assert run.returncode == 0 and "negative control: caught" in run.stdout, run.stdout


@needs_compiler
def test_every_path_gives_the_same_bits_int8_and_float_alike():
    runs = {isa: digests(kernels.check_path(isa).stdout) for isa in NATIVE}
    if CROSS:
        runs["neon"] = digests(kernels.check_path("neon", True).stdout)
    reference = runs["portable"]
    assert any(k.startswith("linear_a16") for k in reference) and "attend_tree" in reference
    for isa, got in runs.items():
        assert got == reference, f"{isa} differs from portable: {set(got.items()) ^ set(reference.items())}"


@pytest.mark.skipif(not CROSS, reason="no aarch64-linux-gnu-g++ and qemu-aarch64 (scripts/test.sh installs them)")
def test_the_neon_path_under_qemu_keeps_rows_bit_identical_and_catches_the_negative_control():
    run = kernels.check_path("neon", True)
    assert run.returncode == 0 and run.stdout.startswith("path neon"), run.stdout + run.stderr
    assert "every row equals its one-row call" in run.stdout
    negative = kernels.check_path("neon", True, "--negative")
    assert "negative control: caught" in negative.stdout


def test_the_paths_a_cpu_can_run_follow_its_flags():
    assert kernels.cpu_isas({"avx2", "fma", "avx"}, "x86_64") == ["avx2", "portable"]
    assert kernels.cpu_isas({"avx2", "fma", "avx512f", "avx512bw", "avx512vl"}, "x86_64") == \
        ["avx512", "avx2", "portable"]
    assert kernels.cpu_isas({"avx2", "fma", "avx512f", "avx512bw", "avx512vl", "amx_tile", "amx_int8"}, "x86_64")[0] \
        == "amx"
    assert kernels.cpu_isas({"avx", "sse4_2"}, "x86_64") == ["portable"]  # AVX only: no FMA, no AVX2
    assert kernels.cpu_isas({"asimd", "fp"}, "aarch64") == ["neon", "portable"]
    assert "-mno-avx512f" not in kernels.compile_flags("avx2") and "-march=x86-64-v3" in kernels.compile_flags("avx2")


def test_forcing_a_path_this_cpu_lacks_is_one_clear_line(monkeypatch, capsys):
    lacking = next(isa for isa in kernels.ISAS if isa not in kernels.cpu_isas())
    monkeypatch.setenv(kernels.ENV, lacking)
    with pytest.raises(kernels.KernelUnavailable, match=f"{kernels.ENV}={lacking}: this CPU") as info:
        kernels.load()
    assert "\n" not in str(info.value)
    with pytest.raises(explorer.ExplorerError, match="not available on this machine") as info:
        explorer.load_models("tiny", device="cpu", precision="int8")
    assert "\n" not in str(info.value)
    from explorer.cli import main

    code = main(["decode", "--preset", "tiny", "--device", "cpu", "--precision", "int8", "--method", "autoregressive",
                 "--prompt", "abc"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and lacking in err


def test_an_unknown_path_is_one_line_naming_the_choices(monkeypatch):
    monkeypatch.setenv(kernels.ENV, "sse9")
    with pytest.raises(kernels.KernelUnavailable, match="unknown kernel path; choose one of amx, avx512, avx2"):
        kernels.chosen_isa()


@pytest.mark.skipif(not kernels.available(), reason="no C++ compiler: exact precisions unavailable")
def test_the_torch_build_runs_the_chosen_path():
    assert kernels.load().path() in (kernels.chosen_isa(), "amx" if kernels.chosen_isa() == "amx" else "")
    assert kernels.build_dir().name.startswith(kernels.chosen_isa() + "-")
    assert "kernel path" in kernels.describe()


# ------------------------------------------------------------------------------------------ the precision, measured

def test_the_chooser_takes_the_fastest_exact_precision_or_float32_when_none_is_faster(monkeypatch):
    def timings(table):
        calls = iter(table)
        monkeypatch.setattr(choice, "pass_ms", lambda target, rows, reps=choice.REPS: next(calls))

    target = explorer.load_models("random-tiny", device="cpu").target
    timings([(10.0, 20.0), (9.0, 19.0), (8.0, 25.0), (4.0, 9.0)])  # float32, then EXACT in order
    picked = choice.measure(target, 3, EXACT)
    assert picked.chosen == "int8" and "the fastest exact precision" in picked.line()
    timings([(3.0, 5.0), (9.0, 19.0), (8.0, 25.0), (4.0, 9.0)])
    picked = choice.measure(target, 3, EXACT)
    assert picked.chosen == "float32" and "no exact precision was faster" in picked.line()
    assert "int8 4 / 9 ms" in picked.line() and "3-token" in picked.line()


@pytest.mark.skipif(not kernels.available(), reason="no C++ compiler: exact precisions unavailable")
def test_the_chooser_picks_float32_when_the_exact_kernels_are_slower_injected_slow_kernel(monkeypatch):
    target = explorer.load_models("random-tiny", device="cpu").target
    fast = RowInvariantLinear.forward

    def slow(self, x):
        time.sleep(0.003)  # a kernel far slower than torch's float32 on this miniature
        return fast(self, x)

    monkeypatch.setattr(RowInvariantLinear, "forward", slow)
    picked = choice.measure(target, 2, EXACT)
    assert picked.chosen == "float32", picked
    assert all(picked.one_row_ms[p] > picked.one_row_ms["float32"] for p in EXACT)


def test_a_choice_is_measured_once_per_machine_then_read(monkeypatch, tmp_path):
    monkeypatch.setenv("EXPLORER_PRECISION_CACHE", str(tmp_path / "choice.json"))
    target = explorer.load_models("random-tiny", device="cpu").target
    made = choice.PrecisionChoice("int8", {"float32": 2.0, "int8": 1.0}, {"float32": 4.0, "int8": 2.0}, 3, "avx2", 1)
    monkeypatch.setattr(choice, "measure", lambda *a: made)
    assert choice.choose("random-tiny", target, 3, ("int8",)) == made

    def never(*a):
        raise AssertionError("measured again")

    monkeypatch.setattr(choice, "measure", never)
    assert choice.choose("random-tiny", target, 3, ("int8",)) == made  # read from the file


def test_the_default_preset_measures_its_precision_on_a_cpu():
    cpu = torch.device("cpu")
    if kernels.available():
        assert resolve_precision(None, cpu, None, exact_by_default=True) == AUTO
    assert resolve_precision(None, cpu, "float32", exact_by_default=True) is None  # a dtype asked for: torch's path
    assert resolve_precision(None, cpu, None, exact_by_default=False) is None  # other presets: float32


def test_the_speculative_default_is_the_fastest_setting_measured_keeping_the_presets_within_3_percent(monkeypatch):
    models = explorer.load_models("random-tiny", device="cpu")

    def table(seconds):
        def timed(models, method, prompt_ids, cfg):
            return seconds["ar"] if method == "autoregressive" else seconds[(cfg.gamma, cfg.draft_confidence)]
        monkeypatch.setattr(choice, "time_decode", timed)

    table({"ar": 1.0, (6, 0.15): 0.8, (1, None): 0.9, (2, None): 0.6, (3, None): 0.7})
    got = choice.measure_speculative(models, 6, 0.15)
    assert (got.gamma, got.draft_confidence) == (2, None) and "chain of 2" in got.line()
    assert got.speedups["chain of 2"] == pytest.approx(1 / 0.6)
    table({"ar": 1.0, (6, 0.15): 0.8, (1, None): 0.5, (2, None): 0.6, (3, None): 0.7})
    assert (choice.measure_speculative(models, 6, 0.15).gamma, got.own) == (1, (6, 0.15))  # a chain of 1 too
    table({"ar": 1.0, (6, 0.15): 0.61, (1, None): 0.9, (2, None): 0.6, (3, None): 0.7})  # the preset's within 3%
    got = choice.measure_speculative(models, 6, 0.15)
    assert (got.gamma, got.draft_confidence) == (6, 0.15) and got.line().startswith("speculative default γ ≤ 6")


def test_the_speculative_measurement_decodes_for_real(monkeypatch):
    models = explorer.load_models("random-tiny", device="cpu")
    monkeypatch.setattr(choice, "SPEC_TOKENS", 6)
    got = choice.measure_speculative(models, 3, None)
    assert set(got.speedups) == {"chain of 3", "chain of 1", "chain of 2"} and all(v > 0 for v in got.speedups.values())


def test_a_decode_at_another_thread_count_runs_the_defaults_measured_at_that_count(monkeypatch, tmp_path):
    """The load measures γ and the cut at one thread; a decode at two gets a choice measured at two (once: then the
    cached one), the trace says which, and a decode at one thread keeps the load's."""
    monkeypatch.setenv("EXPLORER_PRECISION_CACHE", str(tmp_path / "choice.json"))
    models = explorer.load_models("random-tiny", device="cpu")
    models.speculative_choice = choice.SpeculativeChoice(3, None, {"chain of 3": 1.2}, 2, 32, 1, (3, None))
    measured = []

    def at_threads(models, gamma, cut):
        measured.append((gamma, cut, torch.get_num_threads()))
        return choice.SpeculativeChoice(1, None, {"chain of 1": 1.3, "chain of 3": 1.1}, 2, 32,
                                        torch.get_num_threads(), (gamma, cut))

    monkeypatch.setattr(choice, "measure_speculative", at_threads)
    torch.set_num_threads(2)
    trace = explorer.decode("speculative", models, "Hello", max_new_tokens=3)
    again = explorer.decode("speculative", models, "Hi", max_new_tokens=3)
    assert trace.stats["gamma"] == again.stats["gamma"] == 1 and measured == [(3, None, 2)]
    assert "measured here at 2 threads" in trace.stats["speculative_default"]
    torch.set_num_threads(1)
    assert explorer.decode("speculative", models, "Hello", max_new_tokens=3).stats["gamma"] == 3
    own = explorer.decode("speculative", models, "Hello", max_new_tokens=3, gamma=2)
    assert own.stats["gamma"] == 2 and own.stats["speculative_default"] is None  # the request chose its own
    assert len(measured) == 1


# ------------------------------------------------------------------------------------------ threads

@pytest.mark.skipif(not kernels.available() or (os.cpu_count() or 1) < 2, reason="no compiler, or one CPU")
def test_a_second_torch_thread_reaches_the_kernels_and_changes_no_bit():
    """Threads split output columns (and attention rows), never a sum: every kernel gives the same bits at one and
    two threads, and at two the ranges really run on two threads (a build without OpenMP runs them on one)."""
    ext = kernels.load()
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1, 5, 576, generator=g)
    w = torch.randn(960, 576, generator=g)
    w8 = RowInvariantLinear(w, "int8")
    q = torch.randn(9, 5, 64, generator=g)
    k, v = torch.randn(3, 20, 64, generator=g), torch.randn(3, 20, 64, generator=g)

    def run():
        return [w8(x), ext.linear(x, w), ext.linear(x, w.to(torch.bfloat16)), ext.attend(q, k, v, 0.125)]

    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one, used_one = run(), ext.threads_used(8)
        torch.set_num_threads(2)
        two, used_two = run(), ext.threads_used(8)
    finally:
        torch.set_num_threads(before)
    assert (used_one, used_two) == (1, 2)
    for a, b in zip(one, two, strict=True):
        assert torch.equal(a, b)
