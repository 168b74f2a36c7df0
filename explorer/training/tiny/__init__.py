"""The embedded ``tiny`` family, trained from scratch on CPU by ``python -m explorer.train``."""
