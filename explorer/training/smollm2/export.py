"""Stage 4: the shipped artefacts in assets/models/smollm2-135m from the latest checkpoints."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from explorer.compact_weights import save_compact
from explorer.errors import ExplorerError
from explorer.families.eagle import build_eagle_head, save_eagle_head
from explorer.families.smollm2.trimmed_draft import save_trimmed_draft
from explorer.training.smollm2.common import load_target, machine
from explorer.training.smollm2.diffusion import MASK_TOKEN, build_diffusion
from explorer.training.smollm2.draft import build_draft, token_counts

ASSET_DIR = Path(__file__).resolve().parents[3] / "assets" / "models" / "smollm2-135m"
# The LoRA factors as int4 in groups of 16 (their rank, so B's rows of 16 fit one group): a factor's error moves
# only the small LoRA delta, not the base weight (the diffusion card's tables measure it against int8 rows).
LORA_GROUP = 16


def export(work: Path, out: Path | None = None, eagle_vocab: int | None = None) -> dict:
    """Write the shipped artefacts from the latest checkpoints: ``draft/`` (trimmed-head draft), ``eagle/``
    (EAGLE head) and ``diffusion/`` (LoRA delta, mask embedding, diffusion_config.json); the weights compact
    (``explorer.compact_weights``: the draft as int4 differences from the target, the EAGLE head in int8 rows,
    the LoRA factors in int4 groups of ``LORA_GROUP``), the mask embedding in fp16. ``eagle_vocab`` ships the EAGLE
    head with only that many of its kept tokens, the most frequent in the distilled answers (FR-Spec again: its LM
    head is most of a drafting step's cost, and rare tokens are rarely accepted)."""
    from peft import get_peft_model_state_dict, set_peft_model_state_dict  # deferred: peft (~2.7 s to import)

    out = (out or ASSET_DIR).expanduser()
    target, tok = load_target(work)
    # a stage without a checkpoint here keeps its earlier entry (the report of the run that made it)
    old = json.loads((out / "train_report.json").read_text()) if (out / "train_report.json").exists() else {}
    report = {**old, "machine": machine()}
    draft_ckpt, diff_ckpt = work / "draft" / "ckpt.pt", work / "diffusion" / "ckpt.pt"
    eagle_ckpt = work / "eagle" / "ckpt.pt"
    if not any(p.exists() for p in (draft_ckpt, diff_ckpt, eagle_ckpt)):
        raise ExplorerError(f"nothing to export: no checkpoint in {work / 'draft'}, {work / 'eagle'} or "
                            f"{work / 'diffusion'}")
    if draft_ckpt.exists():
        ckpt = torch.load(draft_ckpt)
        draft = build_draft(target, ckpt["kept_ids"], ckpt["layers"])
        draft.load_state_dict(ckpt["model"], strict=False)
        save_trimmed_draft(draft, out / "draft", target=target)
        report["draft"] = {"layers": ckpt["layers"], "kept_vocab": len(ckpt["kept_ids"]), **ckpt["progress"],
                           "params_without_embedding": sum(p.numel() for n, p in draft.named_parameters()
                                                           if "embed_tokens" not in n)}
    if eagle_ckpt.exists():
        ckpt = torch.load(eagle_ckpt)
        kept = ckpt["kept_ids"]
        if eagle_vocab is not None and not 1 <= eagle_vocab <= len(kept):
            raise ExplorerError(f"--keep-vocab for the EAGLE head must be 1 .. {len(kept)} (got {eagle_vocab})")
        if eagle_vocab is not None:
            counts = token_counts(work, tok, target.config.vocab_size)
            counts[tok.eos_token_id] += 1e9  # the end of turn stays proposable
            kept = kept[counts[kept].topk(eagle_vocab).indices].sort().values
        head = build_eagle_head(target, kept, tuple(ckpt.get("fuse_layers", ())))
        head.load_state_dict({**ckpt["model"], "kept_ids": kept})
        save_eagle_head(head, out / "eagle", target=target)
        report["eagle"] = {"kept_vocab": len(kept), "trained_vocab": len(ckpt["kept_ids"]), **ckpt["progress"],
                           "params": sum(p.numel() for p in head.parameters())}
    if diff_ckpt.exists():
        ckpt = torch.load(diff_ckpt)
        rank = ckpt["progress"]["rank"]
        model, _, mask_id = build_diffusion(target, tok, rank)
        set_peft_model_state_dict(model, ckpt["lora"])
        dest = out / "diffusion"
        dest.mkdir(parents=True, exist_ok=True)
        model.peft_config["default"].save_pretrained(str(dest))
        state = get_peft_model_state_dict(model)
        save_compact(state, dest / "adapter_model.safetensors", bits=4, group=LORA_GROUP)
        save_file({"mask_embedding": ckpt["mask_vec"].to(torch.float16)}, str(dest / "mask_embedding.safetensors"))
        (dest / "diffusion_config.json").write_text(json.dumps(
            {"base": "SmolLM2-135M-Instruct (the preset's target)", "mask_token": MASK_TOKEN,
             "mask_token_id": mask_id, "shift_logits": True, "is_causal": False}, indent=2))
        report["diffusion"] = {"lora_rank": rank, "lora_params": sum(v.numel() for v in state.values()),
                               **ckpt["progress"]}
    logged = [e for e in map(json.loads, (work / "log.jsonl").read_text().splitlines())
              if e["stage"].endswith("_eval")]
    # every training run's curves: earlier runs' entries stay (their machines are gone), this work dir's are added once
    seen = {(e["stage"], e.get("time")) for e in old.get("log", [])}
    report["log"] = old.get("log", []) + [e for e in logged if (e["stage"], e.get("time")) not in seen]
    (out / "train_report.json").write_text(json.dumps(report, indent=2))
    sizes = {str(p.relative_to(out)): round(p.stat().st_size / 2**20, 2) for p in sorted(out.rglob("*")) if p.is_file()}
    print(json.dumps(sizes, indent=2))
    return report
