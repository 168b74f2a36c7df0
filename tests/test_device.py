"""Device consistency: every tensor a decoder, drafter or family makes lands on the model's device.

Two checks a CPU can run: a scan of the source that fails on a tensor factory called without ``device=`` in
``explorer/decoding`` and ``explorer/families`` (a line may opt out with ``# cpu:`` and a reason: module
initialisation, a placeholder on the meta device), and every decoder run with torch's default device set to
``meta``, so that a tensor made without a device (which would sit on the CPU beside a CUDA model) is a meta tensor
and the decode fails. The GPU device check (``scripts/gpu_check.sh``) is the real proof."""

import ast
from pathlib import Path

import pytest
import torch

import explorer

FACTORIES = {"zeros", "ones", "full", "empty", "arange", "tensor", "as_tensor", "eye", "rand", "randn", "randint",
             "randperm", "linspace"}
ROOT = Path(explorer.__file__).parent
FOLDERS = ("decoding", "families")


def factories_without_device(source: str) -> list[int]:
    """Line numbers of ``torch.<factory>(...)`` calls with no ``device=`` keyword and no ``# cpu:`` note."""
    lines = source.splitlines()
    bad = []
    for node in ast.walk(ast.parse(source)):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in FACTORIES
                and isinstance(node.func.value, ast.Name) and node.func.value.id == "torch"
                and not any(k.arg == "device" for k in node.keywords)):
            span = lines[node.lineno - 1:node.end_lineno]
            if not any("# cpu:" in line for line in span):
                bad.append(node.lineno)
    return bad


def test_no_tensor_factory_without_a_device_in_the_decoders_and_families():
    found = {str(path.relative_to(ROOT)): lines for folder in FOLDERS for path in sorted((ROOT / folder).glob("*.py"))
             if (lines := factories_without_device(path.read_text()))}
    assert not found, f"tensor factories without device= (add device=..., or '# cpu: why'): {found}"


def test_the_scan_sees_a_factory_without_a_device():
    assert factories_without_device("import torch\nq = torch.tensor([1, 2])\n") == [2]
    assert factories_without_device("import torch\nq = torch.zeros(\n    3, dtype=torch.long)\n") == [2]
    assert factories_without_device("import torch\nq = torch.tensor([1], device=x.device)\n") == []
    assert factories_without_device("import torch\nq = torch.ones(3)  # cpu: module init\n") == []


@pytest.fixture(scope="module")
def tiny():
    return explorer.load_models("tiny")


@pytest.mark.parametrize("method, options", [
    ("autoregressive", {}), ("speculative", {"drafter": "model"}), ("speculative", {"drafter": "prompt_lookup"}),
    ("speculative", {"drafter": "early_exit"}), ("speculative", {"drafter": "diffusion"}),
    ("speculative", {"drafter": "model", "tree": "2,2"}),
    ("speculative", {"drafter": "early_exit", "tree": "dynamic:6"}),
    ("diffusion", {"steps": 8, "block_length": 4}), ("diffusion", {"steps": 4, "block_length": 8, "cache": "dual"}),
    ("diffusion", {"steps": 8, "block_length": 8, "remasking": "random"})])
@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_every_decoder_runs_with_the_default_device_set_to_meta(tiny, method, options, temperature):
    """A tensor made without a device would be a meta tensor here and the decode would fail; the output must equal
    the same decode with the ordinary default device."""
    prompt = "def add(a, b):\n    return a + b\n\ndef add(a, b):"  # repeats, so prompt lookup drafts
    expected = explorer.decode(method, tiny, prompt, max_new_tokens=8, temperature=temperature, **options)
    with torch.device("meta"):
        trace = explorer.decode(method, tiny, prompt, max_new_tokens=8, temperature=temperature, **options)
    assert trace.token_ids == expected.token_ids
