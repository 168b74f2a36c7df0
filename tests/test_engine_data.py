"""The data stage on vLLM (``smollm2 data --engine vllm``): a real vLLM worker (the engine venv that scripts/test.sh
installs) makes shards from the tiny preset's target; its greedy answers are checked against transformers'
``generate`` on the same weights, token for token."""

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from explorer.engine.server import prepare_models
from explorer.errors import ExplorerError
from explorer.training.smollm2.engine_data import answer_rows, generate_shards
from explorer.training.smollm2.store import load_compact

PROMPTS = ["def parse(line):", "class Stack:", "import os\n\ndef main():", "def add(a, b):", "x = [", "for i in"]


def hf_greedy(model, ids: list[int], max_new: int, eos: int) -> list[int]:
    out = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                         max_new_tokens=max_new, do_sample=False, eos_token_id=eos, pad_token_id=eos)
    return out[0, len(ids):].tolist()


def test_vllm_shards_hold_transformers_greedy_answers_and_stop_at_the_budget(tmp_path):
    target, _ = prepare_models("tiny", say=lambda m: None)
    tok = AutoTokenizer.from_pretrained(target)
    chunks = [[{"id": f"s{i}p{j}", "prompt": p} for j, p in enumerate(PROMPTS[2 * i:2 * i + 2])] for i in range(3)]
    made = []
    info = generate_shards(tmp_path / "data", target, list(enumerate(chunks)), lambda t: tok(t)["input_ids"],
                           tok.eos_token_id, budget_s=0.0, max_new=12, dtype="float32", cores="0",
                           shards_per_call=2, on_shard=lambda i, n: made.append(i))
    assert made == [0, 1] and info["shards_made"] == 2  # one call of two shards, then the budget is spent
    assert not (tmp_path / "data" / "shard_00002.npz").exists()
    model = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32).eval()
    greedy = load_compact(tmp_path / "data" / "shard_00000.npz")
    for row, p in zip(greedy, chunks[0], strict=True):
        assert row["id"] == p["id"] and row["prompt_ids"] == tok(p["prompt"])["input_ids"]
        assert row["answer_ids"] == hf_greedy(model, row["prompt_ids"], 12, tok.eos_token_id), p["prompt"]
    sampled = load_compact(tmp_path / "data" / "shard_00001.npz")
    assert all(0 < len(r["answer_ids"]) <= 13 for r in sampled)  # at most 12 drawn, the end-of-turn appended
    assert [r["temperature"] for r in greedy + sampled] == [0.0, 0.0, 1.0, 1.0]


def test_an_answer_that_stopped_keeps_its_end_of_turn_token_once():
    chunk = [{"id": "a", "prompt": "x"}, {"id": "b", "prompt": "y"}, {"id": "c", "prompt": "z"}]
    rows = answer_rows(chunk, [[1], [2], [3]], [{"ids": [5, 6], "finish": "stop"}, {"ids": [5, 9], "finish": "stop"},
                                               {"ids": [5, 6], "finish": "length"}], stop_id=9, temperature=1.0)
    assert [r["answer_ids"] for r in rows] == [[5, 6, 9], [5, 9], [5, 6]]


def test_a_worker_that_cannot_start_says_why_in_one_error(tmp_path):
    (tmp_path / "data").mkdir()
    with pytest.raises(ExplorerError, match="vLLM data worker stopped"):
        generate_shards(tmp_path / "data", tmp_path / "no-such-model", [(0, [{"id": "a", "prompt": "x"}])],
                        lambda t: [1, 2], 0, budget_s=0.0, python=__import__("sys").executable)
