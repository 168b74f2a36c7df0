"""The bench, its sweeps, the peer comparison, the HTML report and the prompt-file loader (random-tiny)."""

import json
import math
import re
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

import explorer
from explorer.cli import main
from explorer.measure import bench, costs, peer, report, sweeps
from explorer.measure.workload import (
    MAX_PROMPTS,
    generative_perplexity,
    ignoring_eos,
    load_prompt_set,
    load_prompt_sets,
    token_entropy_bits,
)

CSV_COLUMNS = {"method", "config", "prompt_set", "prompt_id", "repeat", "new_tokens", "latency_s", "ttft_s",
               "itl_p50_s", "itl_p99_s", "acceptance_rate", "tokens_per_target_pass", "target_forward_passes",
               "draft_forward_passes", "peak_memory_bytes", "memory_kind", "perplexity", "token_entropy_bits"}
FAST = bench.BenchSettings(max_new_tokens=8, warmup=0, progress=False)
CHROMIUM = "/usr/bin/chromium"


@pytest.fixture(scope="module")
def two_prompts():
    return load_prompt_sets("code,prose", limit=1)


def test_bench_with_two_prompts_writes_csv_with_all_columns_and_a_summary(tmp_path, capsys, random_models):
    prompts = tmp_path / "two.jsonl"
    prompts.write_text('{"prompt": "def parse(line):\\n"}\n{"prompt": "The cat", "temperature": 0.7}\n')
    out = tmp_path / "runs" / "bench.csv"
    code = main(["bench", "--preset", "random-tiny", "--device", "cpu", "--prompts", str(prompts), "--repeats", "1",
                 "--warmup", "0", "--max-new-tokens", "8", "--steps", "4", "--csv", str(out)])
    assert code == 0
    frame = pd.read_csv(out)
    assert CSV_COLUMNS <= set(frame.columns)
    assert len(frame) == 2 * 3  # two prompts x three methods, one repeat
    assert set(frame["method"]) == {"autoregressive", "speculative", "diffusion"}
    assert (frame["latency_s"] > 0).all() and (frame["peak_memory_bytes"] > 0).all()
    assert frame.loc[frame["prompt_id"] == "line-2", "temperature"].eq(0.7).all()  # the prompt's own temperature
    printed = capsys.readouterr().out
    for header in ("lat p50 ms", "lat p95", "lat p99", "ttft p99", "itl p99", "accept", "tok/s"):
        assert header in printed
    assert "speculative[model, γ=4]" in printed


def _frame(latencies, gaps, method="autoregressive", config="autoregressive"):
    n = len(latencies)
    return pd.DataFrame({
        "method": method, "config": config, "prompt_set": "s", "group": "", "x": None, "gamma": None,
        "latency_s": latencies, "ttft_s": latencies, "itl_p50_s": [float(np.median(g)) for g in gaps],
        "acceptance_rate": None, "new_tokens": [len(g) + 1 for g in gaps], "target_forward_passes": 10,
        "draft_forward_passes": 0, "proposed": 0, "accepted": 0, "decode_steps": 9, "step_forward_s": 0.01,
        "draft_pass_s": float("nan"), "overhead_s": 0.0, "itl_s": gaps}, index=range(n))


def test_percentiles_equal_numpys_on_known_data():
    rng = np.random.default_rng(0)
    latencies = list(rng.lognormal(0, 1, 57))
    gaps = [list(rng.exponential(0.01, int(k))) for k in rng.integers(2, 20, 57)]
    table = bench.summarize_requests(_frame(latencies, gaps))
    pooled = [g for request in gaps for g in request]
    for q in (50, 95, 99):
        assert table[f"latency_p{q}_s"].iloc[0] == pytest.approx(np.percentile(latencies, q), rel=1e-12)
        assert table[f"itl_p{q}_s"].iloc[0] == pytest.approx(np.percentile(pooled, q), rel=1e-12)


def test_fit_alpha_inverts_the_iid_acceptance_rate():
    for alpha, gamma in [(0.3, 4), (0.8, 5), (0.95, 2)]:
        rate = sum(alpha ** i for i in range(1, gamma + 1)) / gamma
        assert bench.fit_alpha(rate, gamma) == pytest.approx(alpha, abs=1e-9)


def test_crossings_of_two_power_laws_are_found_where_they_meet():
    n = [16, 32, 64, 128]
    ar = [x * 1.0 for x in n]  # latency = N
    diffusion = [x * x / 64 for x in n]  # latency = N^2 / 64: equal at N = 64, faster below
    (n_cross, lat, faster_above), = sweeps.find_crossings(n, diffusion, ar)
    assert n_cross == pytest.approx(64) and lat == pytest.approx(64) and faster_above == "second"


def test_quality_scores_match_a_reference():
    assert token_entropy_bits([5, 5, 5, 5]) == 0.0
    assert token_entropy_bits([1, 2, 3, 4]) == pytest.approx(2.0)
    torch.manual_seed(0)
    from explorer.families.random_tiny import build_random_llama

    judge = build_random_llama(50, 32, 1, seed=0).eval()
    context, output = [1, 2, 3, 4], [5, 6, 7]
    ids = torch.tensor([context + output])
    labels = ids.clone()
    labels[0, : len(context)] = -100  # the reference: transformers' own shifted loss over the output only
    with torch.no_grad():
        reference = math.exp(judge(input_ids=ids, labels=labels).loss.item())
    assert generative_perplexity(judge, context, output) == pytest.approx(reference, rel=1e-5)


def test_ignoring_eos_makes_exactly_max_new_tokens(random_models):
    fixed = ignoring_eos(random_models)
    assert fixed.tokenizer.eos_token_id is None and random_models.tokenizer.eos_token_id is not None
    assert fixed.tokenizer("abc").input_ids == random_models.tokenizer("abc").input_ids
    for method in ("autoregressive", "speculative"):
        assert explorer.decode(method, fixed, "abc", max_new_tokens=12).stats["new_tokens"] == 12


@pytest.fixture(scope="module")
def sections(random_models, two_prompts):
    """A gamma sweep, a diffusion break-even sweep, a batch sweep and the memory table, kept small."""
    gamma, _ = sweeps.sweep_section("gamma", random_models, two_prompts, FAST, values=(1, 3))
    diffusion, _ = sweeps.diffusion_section(random_models, two_prompts[:1], FAST, lengths=(8, 16), divisors=(2, 4))
    batch, _ = costs.batch_section(random_models, two_prompts[:1], FAST, acceptance=0.5, batches=(1, 2), reps=1)
    memory, _ = costs.memory_section(random_models)
    return [gamma, diffusion, batch, memory]


def test_sweeps_produce_their_figures(sections):
    gamma, diffusion, batch, memory = sections
    names = {t.name for t in gamma.figures[0].data}
    assert {"code: measured", "prose: measured", "code: predicted (forward times)"} <= names
    table = gamma.tables["gamma sweep"]
    assert set(table["config"]) >= {"speculative[model, γ=1]", "speculative[model, γ=3]"}
    assert table.loc[table["config"] != "autoregressive", "predicted_speedup_thm"].notna().all()
    series = {t.name for t in diffusion.figures[0].data}
    assert {"autoregressive", "speculative γ=4", "diffusion K=N/2", "diffusion K=N/4"} <= series
    assert any("Break-even N" in note for note in diffusion.notes)
    frame = batch.tables["batch sweep"]
    assert list(frame["batch"]) == [1, 2] and (frame["cost_ratio_c"] > 0).all()
    assert any("PREDICTED" in note for note in batch.notes)
    kv = memory.tables["memory per configuration"]
    assert (kv.loc[kv["config"] == "speculative[model]", "draft_kv_bytes"] > 0).all()
    formula, real = re.search(r"formula (\d+) B, a real DynamicCache (\d+) B", memory.notes[0]).groups()
    assert formula == real  # the KV-cache formula matches the bytes a real cache holds


def test_peer_outputs_equal_ours_at_temperature_zero(random_models, two_prompts):
    frame = peer.run_peer(random_models, two_prompts[:1], FAST)
    assert set(frame["pair"]) == {"greedy", "draft model", "prompt lookup"}
    assert frame["output_equal"].all()
    summary = peer.peer_summary(frame)
    assert (summary["time_ours_over_theirs"] > 0).all() and (summary["outputs_equal"] == "1/1").all()


def test_html_report_opens_in_chromium_without_console_errors(tmp_path, sections):
    path = report.write_report(tmp_path / "report.html", {"machine": "test", "device": "cpu"}, sections)
    page_text = path.read_text()
    assert "<script src=" not in page_text  # plotly.js is inline: the page works offline
    if not Path(CHROMIUM).exists() and not shutil.which("chromium"):
        pytest.skip("Chromium not installed (apt-get install -y chromium)")
    playwright = pytest.importorskip("playwright.sync_api")
    args = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
            "--disable-component-update", "--disable-sync"]
    problems = []
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM if Path(CHROMIUM).exists() else shutil.which("chromium"),
                                    args=args)
        page = browser.new_page()
        page.on("console", lambda m: problems.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: problems.append(str(e)))
        page.goto(path.as_uri())
        page.wait_for_function("document.querySelectorAll('.js-plotly-plot .main-svg').length > 0", timeout=20_000)
        plots = page.locator(".js-plotly-plot").count()
        browser.close()
    assert problems == []
    assert plots == sum(len(s.figures) for s in sections)


# ---------------------------------------------------------------------------------------------
# bad prompt files: one clear message, or bounded with a notice

@pytest.mark.parametrize("content, message", [
    (None, "not found"),
    (b"", "is empty"),
    (b"\n  \n\n", "is empty"),
    (b"\x7fELF\x02\x01\x01\x00\x00\x00binary", "looks binary"),
    ("caf\u00e9\n".encode("latin-1"), "not UTF-8"),
    (b'{"prompt": "ok"}\n{"prompt": \n', "line 2: not valid JSON"),
    (b'{"text": "no prompt key"}\n', "non-empty \\\"prompt\\\""),
    (b'{"prompt": "hot", "temperature": -1}\n', "temperature must be"),
])
def test_bad_prompt_files_get_one_clear_message(tmp_path, content, message):
    path = tmp_path / "prompts.txt"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(explorer.ExplorerError, match=message.replace("\\", "")):
        load_prompt_set(str(path))


def test_a_10000_line_file_is_bounded_with_a_notice(tmp_path):
    path = tmp_path / "many.txt"
    path.write_text("\n".join(f"prompt number {i}" for i in range(10_000)))
    loaded = load_prompt_set(str(path))
    assert len(loaded.prompts) == MAX_PROMPTS and loaded.prompts[0].text == "prompt number 0"
    assert "kept the first 1000 of 10000" in loaded.notice
    assert load_prompt_set(str(path), limit=5).notice is None


def test_prompts_too_long_for_the_context_are_skipped_with_a_notice(tmp_path, capsys, random_models):
    path = tmp_path / "mixed.txt"
    path.write_text("short prompt\n" + "x" * 600 + "\n")  # byte tokenizer: 600 tokens > the 512 context
    (kept,) = bench.fit_prompts(random_models, [load_prompt_set(str(path))],
                                bench.plain_configs(["autoregressive"], FAST), FAST)
    assert [p.text for p in kept.prompts] == ["short prompt"]
    assert "skipped 1 of 2 prompts" in capsys.readouterr().err


def test_cli_prints_one_line_for_a_bad_prompt_file(tmp_path, capsys):
    binary = tmp_path / "weights.bin"
    binary.write_bytes(bytes(range(256)) * 4)
    assert main(["bench", "--preset", "random-tiny", "--prompts", str(binary)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "looks binary" in err
    assert main(["bench", "--preset", "random-tiny", "--sweep", "gamma,colour"]) == 2
    assert "unknown sweep" in capsys.readouterr().err


def test_shipped_prompt_sets_load(tmp_path):
    for name in ("code", "code_edit", "prose", "multilingual", "high_temperature"):
        loaded = load_prompt_set(name)
        assert len(loaded.prompts) >= 10 and loaded.notice is None
    hot = load_prompt_set("high_temperature")
    assert all(p.temperature is not None and p.temperature > 0.5 for p in hot.prompts)
    assert all(json.loads(line)["prompt"] for line in (Path(bench.__file__).parents[2] / "assets" / "prompts" /
                                                        "code.jsonl").read_text().splitlines())
