"""Training recipes: ``tiny/`` (the tiny family, run by ``python -m explorer.train``) and ``smollm2/`` (the
SmolLM2-135M draft and diffusion partner). Nothing here is imported by the decoders or the app."""
