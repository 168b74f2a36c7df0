"""Training recipes. ``explorer.train`` (the tiny family) and ``explorer.training.smollm2`` (the
SmolLM2-135M draft and diffusion partner). Nothing here is imported by the decoders or the app."""
