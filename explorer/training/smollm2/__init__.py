"""Train the SmolLM2-135M-Instruct family's draft and diffusion partner here, on CPU.

    python -m explorer.train smollm2 data      [--budget-min 50] [--batch 32] [--max-new 256]
    python -m explorer.train smollm2 draft     [--budget-min 60] [--layers 4] [--keep-vocab 8192]
    python -m explorer.train smollm2 eagle     [--budget-min 60] [--keep-vocab 16384] [--depths 3]
    python -m explorer.train smollm2 diffusion [--budget-min 60] [--lora-rank 16]
    python -m explorer.train smollm2 export    [--keep-vocab 2048]  # writes assets/models/smollm2-135m/...

Every stage checkpoints into ``--work-dir`` (default ``~/.cache/decoding-explorer/smollm2``) and
resumes from there; ``export`` writes the shipped artefacts. Nothing is downloaded.

1. data      -- sequence-level distillation data: the target's *own answers* to the chat prompt mix
                (``explorer.training.prompts``), generated batched, alternating greedy and
                temperature-1 batches; for every answer position the teacher's top-k log-probs, and
                the target's final hidden states along prompt and answer (for the EAGLE head).
2. draft     -- a shallow copy of the target (its embedding, shared and frozen; its first ``layers``
                decoder layers; its final norm) with a *trimmed* LM head over the ``keep_vocab`` most
                frequent answer tokens (FR-Spec, Zhao et al. 2025), trained by cross-entropy against
                the teacher's top-k distribution (forward KL up to a constant) at every answer
                position. Outside the kept set q = 0, so exact speculative sampling still holds
                (``explorer.families.smollm2.trimmed_draft``).
2b. eagle    -- an EAGLE head (``explorer.families.eagle``): one decoder layer over [embedding of the next
                token ; the target's feature] that predicts the next feature, read by the target's own
                LM head cut to the ``keep_vocab`` most frequent tokens. Trained with EAGLE-3's
                training-time test (``depths`` drafting steps unrolled, each on its own predictions)
                by KL to the target's distribution plus a feature regression.
3. diffusion -- the target adapted to masked diffusion (bidirectional attention, logits shifted by
                one: Dream / DiffuLLaMA) with a LoRA delta and a trained [MASK] embedding, on the
                answers (prompt kept clean): half MDLM/LLaDA masking with probability t ~ U(0, 1)
                weighted by 1/t, half block-diffusion masking (clean prefix, one noisy block, masked
                suffix), the situation semi-autoregressive decoding meets.
4. export    -- fp16 draft (no embedding: the target's is shared), fp16 EAGLE head (no embedding or LM
                head: the target's are shared), fp32 LoRA delta, mask embedding.

Modules: ``common`` (target, held-out answers, logging), ``data``, ``draft``, ``eagle``, ``diffusion``, ``export``,
``cli``.
"""

from explorer.training.smollm2.cli import main

__all__ = ["main"]
