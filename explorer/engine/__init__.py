"""Engine mode: a live vLLM server (started here or anywhere), measured and animated on your own traffic."""
