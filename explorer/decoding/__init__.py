"""Decoding: the options (config), logits → distributions (sampling), the events and Trace (events), the three
decoders (autoregressive, speculative, diffusion), the drafters, and the API that runs them (api).

Imports nothing from the app or the measurements; see docs/design.md for the layers.
"""
