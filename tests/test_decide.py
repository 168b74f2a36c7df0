"""``explorer decide``: the verdict logic against synthetic requests with known numbers, the tail flag, the automatic
groups, and one end-to-end run on ``tiny`` (every section in the JSON, with intervals; an unreachable engine and an
empty group each one line while the rest of the report is written; bad files one line)."""

import json

import numpy as np
import pandas as pd
import pytest

from explorer.cli import main
from explorer.measure.decide import categorize, crossing, group_rows, tail_flag, verdict


def _requests(category: str, ar_spt: float, spec_spt: float, n: int = 12, seed: int = 0,
              spread: float = 0.05) -> list[dict]:
    """n AR and n speculative requests whose seconds per token scatter by ``spread`` around the given values."""
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        noise = 1 + spread * rng.standard_normal()  # the same draw for both methods: equal speeds give a ratio of 1
        for method, spt in (("autoregressive", ar_spt), ("speculative", spec_spt)):
            own = noise if method == "autoregressive" or spread < 0.2 else 1 + spread * rng.standard_normal()
            x = spt * max(0.1, own)
            rows.append({"category": category, "temperature": 0.0, "method": method, "prompt_id": f"{category}-{i}",
                         "repeat": 0, "new_tokens": 32, "latency_s": 32 * x, "seconds_per_token": x,
                         "target_forward_passes": 16 if method == "speculative" else 32,
                         "proposed": 48 if method == "speculative" else 0,
                         "accepted": 24 if method == "speculative" else 0, "itl_s": [x] * 31})
    return rows


def test_verdicts_follow_the_speedup_interval_on_known_numbers():
    frame = pd.DataFrame(_requests("code", 0.010, 0.005) + _requests("prose", 0.010, 0.020, seed=1)
                         + _requests("mixed", 0.010, 0.010, seed=2)
                         + _requests("noisy", 0.012, 0.010, n=5, seed=3, spread=0.5))
    rows = {r["group"]: r for r in group_rows(frame)}
    code, prose, mixed = rows["code at T = 0"], rows["prose at T = 0"], rows["mixed at T = 0"]
    assert code["verdict"] == "enable" and code["speedup_lo"] > 1 and abs(code["speedup"] - 2) < 0.1
    numbers = f"{code['speedup']:.2f}x [{code['speedup_lo']:.2f}, {code['speedup_hi']:.2f}]"
    assert code["line"] == f"enable for code at T = 0: {numbers}"
    assert prose["verdict"] == "do not enable" and prose["speedup_hi"] < 1 and abs(prose["speedup"] - 0.5) < 0.05
    assert mixed["verdict"] == "no clear gain" and mixed["speedup_lo"] < 1 < mixed["speedup_hi"]
    noisy = rows["noisy at T = 0"]  # a gain on average whose interval still spans 1 decides nothing
    assert noisy["speedup"] > 1 > noisy["speedup_lo"] and noisy["verdict"] == "no clear gain"
    assert code["acceptance"] == pytest.approx(0.5) and code["tokens_per_pass"] == pytest.approx(2.0)
    assert code["acceptance_lo"] <= 0.5 <= code["acceptance_hi"]
    assert "all traffic (pooled)" in rows


def test_too_few_requests_decide_nothing():
    assert verdict("x", (2.0, 2.0, 2.0), n=1)["verdict"] == "too few requests"
    assert verdict("x", (2.0, 1.5, 2.5), n=3)["verdict"] == "enable"


def test_the_tail_flag_says_when_the_mean_improves_and_p99_does_not():
    ar = [1.0] * 100
    spec = [0.5] * 97 + [3.0] * 3  # faster on average, slower at p99
    assert tail_flag(ar, spec) == "the mean latency improves but p99 does not"
    assert tail_flag(ar, [0.5] * 100) == ""
    assert tail_flag(ar, [1.5] * 100) == ""


def test_crossing_of_the_gain_through_one():
    assert crossing([1, 2, 4, 8], [1.5, 1.3, 1.1, 0.9]) == pytest.approx(6.0)
    assert crossing([1, 2, 4], [1.5, 1.3, 1.1]) is None
    assert crossing([1, 2], [0.8, 0.7]) == 1.0


@pytest.mark.parametrize("text, tokens, expected", [
    ("def parse(line):", 5, "code"), ("Write a JavaScript function that sorts", 8, "code"),
    ("Explique la photosynthèse en termes simples.", 12, "non-English"), ("Erkläre, warum der Himmel blau ist.", 9,
                                                                          "non-English"),
    ("Tell me about the moon.", 6, "prose"), ("Tell me about the moon.", 900, "long context")])
def test_automatic_groups(text, tokens, expected):
    assert categorize(text, tokens) == expected


@pytest.fixture(scope="module")
def decided(tmp_path_factory):
    path = tmp_path_factory.mktemp("decide")
    traffic = path / "traffic.jsonl"
    lines = [{"prompt": p, "category": "code"} for p in ("def add(a, b):", "import os\ndef walk(path):",
                                                         "class Stack:\n    def push(self, x):")]
    lines += [{"prompt": p} for p in ("The weather today is", "Once upon a time there", "My favourite food is")]
    lines.append({"prompt": "word " * 600, "category": "huge"})  # longer than tiny's context: an empty group
    traffic.write_text("\n".join(json.dumps(x) for x in lines))
    out = path / "out.json"
    code = main(["decide", "--preset", "tiny", "--prompts", str(traffic), "--max-new-tokens", "8",
                 "--engine", "http://127.0.0.1:9", "--compare", "http://127.0.0.1:9", "--swap", "tiny",
                 "--json", str(out), "--html", str(path / "out.html")])
    return code, json.loads(out.read_text()), (path / "out.html").read_text()


def test_every_section_is_in_the_json_with_intervals(decided):
    code, result, page = decided
    assert code == 0
    groups = {g["group"]: g for g in result["groups"]}
    assert {"code at T = 0", "prose at T = 0", "all traffic (pooled)"} <= set(groups)
    for g in result["groups"]:
        assert g["speedup_lo"] <= g["speedup"] <= g["speedup_hi"] and g["verdict"] and g["line"]
        assert g["acceptance_lo"] <= g["acceptance"] <= g["acceptance_hi"]
    assert {(t["method"], t["metric"]) for t in result["tail"]} >= {
        ("autoregressive", "request latency"), ("speculative", "inter-token latency")}
    assert all(t["p99_lo_ms"] <= t["p99_ms"] <= t["p99_hi_ms"] for t in result["tail"] if t["n"])
    assert result["batch"]["source"] == "predicted" and result["batch"]["rows"]  # the engine did not answer
    assert result["memory"] and result["memory"][0]["drafter_kv_bytes"] > 0  # tiny's drafter is a model
    # the frontier: K = N/d, and every registered sampler at its defaults
    from explorer.decoding.unmasking import SAMPLERS

    assert "K=8" in {r["config"] for r in result["diffusion"]} and "confidence, threshold 0.9" in {
        r["config"] for r in result["diffusion"]}
    assert {r["config"].split(",")[0] for r in result["diffusion"]} >= set(SAMPLERS)
    assert all(0 < r["tokens_per_pass"] <= 8 and 0 <= r["distinct_3"] <= 1 for r in result["diffusion"])
    assert result["header"]["preset"] == "tiny" and "machine" in result["header"]
    # re-measured after a "swap" to the same target: greedy acceptance is deterministic, so nothing moved
    swap = {r["group"]: r for r in result["swap"]}
    assert set(swap) == set(groups) and all(r["acceptance_change"] == 0 for r in swap.values())
    assert "the decision" in page and "Verdicts" in page
    # the HTML report carries the frontier plot too: a trace per diffusion setting
    assert "Diffusion: tokens per pass against repeated words" in page
    assert all(json.dumps(r["config"])[1:-1] in page for r in result["diffusion"])


def test_an_unreachable_engine_and_an_empty_group_are_one_line_each(decided):
    _, result, _ = decided
    assert len([e for e in result["errors"] if e.startswith("batch:")]) == 1
    assert len([e for e in result["errors"] if "'huge'" in e]) == 1
    assert "huge" not in {g["category"] for g in result["groups"]}


@pytest.mark.parametrize("content, message", [(None, "not found"), ('{"prompt": "x", "category": 3}', "category"),
                                              ("{not json", "not valid JSON")])
def test_a_missing_or_malformed_file_is_one_line(tmp_path, capsys, content, message):
    path = tmp_path / "t.jsonl"
    if content is not None:
        path.write_text(content)
    assert main(["decide", "--preset", "tiny", "--prompts", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]


def test_the_batch_sentence():
    from explorer.measure.decide import batch_sentence

    rows = [{"predicted_speedup_forward": g} for g in (1.4, 1.2, 0.9)]
    assert batch_sentence({"source": "predicted", "rows": rows, "crosses_1_at_batch": 3.3}).endswith("batch 3.3")
    rows[0]["predicted_speedup_forward"] = 0.8
    assert "already 0.80x at batch 1" in batch_sentence({"source": "predicted", "rows": rows, "crosses_1_at_batch": 1})
    assert "stays above 1" in batch_sentence({"source": "measured", "rows": rows, "crosses_1_at_batch": None})


def test_the_checklist_tab_fills_in_the_tables_and_refuses_bad_input():
    import gradio as gr

    from explorer.app.decide_tab import EXAMPLE, decide_tab

    verdicts, groups, tail, memory, diffusion, frontier, files = decide_tab("tiny", EXAMPLE, None, "0", 8, False)
    assert "code at T = 0" in verdicts and "prose at T = 0" in verdicts and "batch (predicted)" in verdicts
    assert list(groups["Group"])[:2] == ["code at T = 0", "prose at T = 0"] and len(tail) and len(memory)
    assert diffusion.empty and [f.rsplit(".", 1)[1] for f in files] == ["json", "html"] and not frontier.data
    assert list(diffusion.columns)[0] == "Setting"  # named columns even when empty, never Gradio's "1 2 3"
    for text, temps, message in (("", "0", "paste prompts"), (EXAMPLE, "hot", "temperatures"),
                                 ("\n".join(["x"] * 30), "0", "at most 24")):
        with pytest.raises(gr.Error, match=message):
            decide_tab("tiny", text, None, temps, 8, False)


def test_the_checklist_tables_are_for_people(decided):
    """Human column names, MiB and %, at most 4 significant digits, intervals as "1.49x [1.17–1.86]", and a caption
    for the speculative inter-token p50 of 0 ms."""
    import re

    from explorer.app.decide_tab import interval, sig, tables

    _, result, _ = decided
    errors, (groups, tail, caption, memory, diffusion) = tables(result)
    assert errors == []
    assert "Speedup vs autoregressive" in groups.columns and "drafter_kv_bytes" not in memory.columns
    for table in (groups, tail, memory, diffusion):
        for cell in table.astype(str).to_numpy().ravel():
            for digits in re.findall(r"\d[\d,.]*", cell):
                assert len(re.sub(r"\D", "", digits).lstrip("0")) <= 4, cell  # no raw bytes, no long fractions
    assert all(c.endswith("MiB") for c in memory["Drafter KV cache"])
    assert memory["Drafter's share"].str.endswith("%").all()
    assert re.fullmatch(r"[\d.]+x \[[\d.]+–[\d.]+\]", groups["Speedup vs autoregressive"].iloc[-1])
    assert interval(1.4912, 1.1703, 1.8649, "x") == "1.49x [1.17–1.86]" and sig(0.04524343282772585) == "0.0452"
    zero = [dict(r, p50_ms=0.0) if r["method"] == "speculative" and r["metric"] == "inter-token latency" else r
            for r in result["tail"]]
    assert "arrive together" in tables({**result, "tail": zero})[1][2]


def test_a_checklist_part_that_fails_is_one_line_and_the_rest_shows(monkeypatch):
    from explorer.app import decide_tab as tab

    def broken(models, sets, s):
        raise RuntimeError("boom")

    monkeypatch.setattr(tab, "decide", broken)
    verdicts, groups, tail, memory, diffusion, frontier, files = tab.decide_tab("tiny", tab.EXAMPLE, None, "0", 8,
                                                                                False)
    assert "error: the checklist could not be measured (RuntimeError: boom)" in verdicts
    assert list(groups.columns) == tab.GROUP_COLUMNS and files is None
    errors, shown = tab.tables({"groups": [{"group": "x"}], "tail": [], "memory": [], "diffusion": []})
    assert len(errors) == 1 and errors[0].startswith("groups: KeyError") and list(shown[0].columns) == tab.GROUP_COLUMNS


@pytest.mark.skipif(not __import__("explorer.precision", fromlist=["kernels"]).kernels.available(),
                    reason="no C++ compiler: exact precisions unavailable")
def test_the_checklist_at_an_exact_precision_with_diffusion_gives_verdicts_and_a_named_batch_line():
    """The default preset's empty checklist: its batch sweep ran batched passes on the batch-1 exact kernels and the
    error emptied every table. Now the batch part is one named line and the rest is measured."""
    from explorer.app.decide_tab import EXAMPLE, decide_tab

    verdicts, groups, tail, memory, diffusion, frontier, files = decide_tab("tiny@int8", EXAMPLE, None, "0", 8, True)
    assert "code at T = 0" in verdicts and "error: batch: the exact int8 kernels run batch 1 only" in verdicts
    assert len(groups) and len(tail) and len(memory) and len(diffusion) and files
    # the frontier plot: a point per diffusion setting, at the table's tokens per pass
    points = [(x, trace.name.removesuffix(" (quality does not hold)")) for trace in frontier.data for x in trace.x]
    assert sorted(label for _, label in points) == sorted(diffusion["Setting"])
    assert sorted(x for x, _ in points) == sorted(float(v) for v in diffusion["Tokens per pass"])


def test_the_diffusion_rows_include_the_lane_as_the_preset_starts_it():
    from types import SimpleNamespace

    from explorer.measure.decide import lane_default_config
    from explorer.models import PRESETS

    (row,) = lane_default_config(SimpleNamespace(preset=PRESETS["smollm2-135m"]), 64, 8)
    assert row.label == ("the lane's default: confidence, threshold 0.35, no word twice in a row, no 4-token phrase "
                         "twice, the delayed cache")
    assert row.options == {"steps": 64, "block_length": 8, "sampler": "confidence", "threshold": 0.35,
                           "no_adjacent_repeat": True, "no_repeat_ngram": 4, "cache": "delayed"}
    assert lane_default_config(SimpleNamespace(preset=PRESETS["tiny"]), 64, 8) == []  # its lane is a sampler row
