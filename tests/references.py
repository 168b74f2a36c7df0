"""Plain-numpy references the product is tested against (never the product's own code)."""

import numpy as np


def np_warp(logits, temperature, top_k=None, top_p=None):
    """softmax(logits / T) restricted to the k largest logits, then to the smallest set of the most
    probable tokens whose mass reaches top_p; T = 0 is a one-hot argmax. float64."""
    z = np.asarray(logits, dtype=np.float64)
    if temperature == 0:
        out = np.zeros(len(z))
        out[np.argmax(z)] = 1.0
        return out
    probs = np.exp(z / temperature - np.max(z / temperature))
    probs /= probs.sum()
    if top_k is not None:
        kept = np.argsort(-z)[:top_k]
        mask = np.zeros(len(z), bool)
        mask[kept] = True
        probs = np.where(mask, probs, 0.0) / probs[mask].sum()
    if top_p is not None:
        order = np.argsort(-probs)
        mass, keep = 0.0, np.zeros(len(z), bool)
        for i in order:
            if mass >= top_p:
                break
            keep[i] = True
            mass += probs[i]
        probs = np.where(keep, probs, 0.0) / probs[keep].sum()
    return probs
