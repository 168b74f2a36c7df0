"""A small OpenAI-compatible server that is not vLLM, for the engine tests: it streams the explorer's own greedy
decode of the tiny preset, one token per chunk, sends no usage and has no /metrics.

    python tests/openai_like_server.py PORT [DELAY_S]
"""

import json
import sys
import time

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

import explorer

MODELS = explorer.load_models("tiny")
DELAY_S = float(sys.argv[2]) if len(sys.argv) > 2 else 0.0


async def health(request: Request) -> JSONResponse:
    return JSONResponse({})


async def models(request: Request) -> JSONResponse:
    return JSONResponse({"object": "list", "data": [{"id": "explorer-tiny", "object": "model"}]})


async def completions(request: Request) -> StreamingResponse:
    body = await request.json()
    prompt = body["prompt"] if isinstance(body["prompt"], str) else MODELS.tokenizer.decode(body["prompt"])

    def events():
        gen = explorer.stream("autoregressive", MODELS, prompt, max_new_tokens=int(body.get("max_tokens", 16)),
                              temperature=0.0)
        for event in gen:
            time.sleep(DELAY_S)
            text = MODELS.tokenizer.decode([event.token])
            chunk = {"id": "x", "object": "text_completion", "created": 0, "model": "explorer-tiny",
                     "choices": [{"index": 0, "text": text, "finish_reason": None, "logprobs": None}]}
            yield f"data: {json.dumps(chunk)}\n\n"
        yield "data: [DONE]\n\n"

    return StreamingResponse(events(), media_type="text/event-stream")


app = Starlette(routes=[Route("/health", health), Route("/v1/models", models),
                        Route("/v1/completions", completions, methods=["POST"])])

if __name__ == "__main__":
    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
