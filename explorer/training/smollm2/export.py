"""Stage 4: the shipped artefacts in assets/models/smollm2-135m from the latest checkpoints."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from explorer.errors import ExplorerError
from explorer.training.smollm2.common import load_target, machine
from explorer.training.smollm2.diffusion import MASK_TOKEN, build_diffusion
from explorer.training.smollm2.draft import build_draft

ASSET_DIR = Path(__file__).resolve().parents[3] / "assets" / "models" / "smollm2-135m"


def export(work: Path, out: Path | None = None) -> dict:
    """Write the shipped artefacts from the latest checkpoints: ``draft/`` (trimmed-head draft, fp16)
    and ``diffusion/`` (LoRA delta in fp32, mask embedding, diffusion_config.json)."""
    from peft import get_peft_model_state_dict, set_peft_model_state_dict
    from safetensors.torch import save_file

    from explorer.trimmed_draft import save_trimmed_draft

    out = (out or ASSET_DIR).expanduser()
    target, tok = load_target(work)
    report = {"machine": machine()}
    draft_ckpt, diff_ckpt = work / "draft" / "ckpt.pt", work / "diffusion" / "ckpt.pt"
    if not draft_ckpt.exists() and not diff_ckpt.exists():
        raise ExplorerError(f"nothing to export: no checkpoint in {work / 'draft'} or {work / 'diffusion'}")
    if draft_ckpt.exists():
        ckpt = torch.load(draft_ckpt)
        draft = build_draft(target, ckpt["kept_ids"], ckpt["layers"])
        draft.load_state_dict(ckpt["model"], strict=False)
        save_trimmed_draft(draft, out / "draft")
        report["draft"] = {"layers": ckpt["layers"], "kept_vocab": len(ckpt["kept_ids"]), **ckpt["progress"],
                           "params_without_embedding": sum(p.numel() for n, p in draft.named_parameters()
                                                           if "embed_tokens" not in n)}
    if diff_ckpt.exists():
        ckpt = torch.load(diff_ckpt)
        rank = ckpt["progress"]["rank"]
        model, _, mask_id = build_diffusion(target, tok, rank)
        set_peft_model_state_dict(model, ckpt["lora"])
        dest = out / "diffusion"
        dest.mkdir(parents=True, exist_ok=True)
        model.peft_config["default"].save_pretrained(str(dest))
        # fp32: rounding the LoRA factors to fp16 moved logits by up to 0.2
        state = {k: v.float().contiguous() for k, v in get_peft_model_state_dict(model).items()}
        save_file(state, str(dest / "adapter_model.safetensors"))
        save_file({"mask_embedding": ckpt["mask_vec"].to(torch.float16)}, str(dest / "mask_embedding.safetensors"))
        (dest / "diffusion_config.json").write_text(json.dumps(
            {"base": "SmolLM2-135M-Instruct (the preset's target)", "mask_token": MASK_TOKEN,
             "mask_token_id": mask_id, "shift_logits": True, "is_causal": False}, indent=2))
        report["diffusion"] = {"lora_rank": rank, "lora_params": sum(v.numel() for v in state.values()),
                               **ckpt["progress"]}
    report["log"] = [json.loads(line) for line in (work / "log.jsonl").read_text().splitlines()
                     if '"eval' in line]
    (out / "train_report.json").write_text(json.dumps(report, indent=2))
    sizes = {str(p.relative_to(out)): round(p.stat().st_size / 2**20, 2) for p in sorted(out.rglob("*")) if p.is_file()}
    print(json.dumps(sizes, indent=2))
    return report
