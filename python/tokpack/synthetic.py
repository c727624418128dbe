"""Synthetic corpora with SFT-like length distributions, for the demo, tests and benchmarks."""

from __future__ import annotations

import numpy as np

__all__ = ["sft_lengths"]

# (weight, median, sigma) of a lognormal mixture: mostly short chat turns, a band of longer
# answers and a thin tail of long documents, clipped to [1, max_length]. The overall median is
# close to 250 tokens and the tail reaches 8k, like public SFT mixtures.
_MIXTURE = ((0.62, 160.0, 0.75), (0.28, 560.0, 0.70), (0.10, 2300.0, 0.65))


def sft_lengths(n: int, seed: int = 0, max_length: int = 8192) -> np.ndarray:
    """``n`` sample lengths (int32) drawn from an SFT-like lognormal mixture."""
    rng = np.random.default_rng(seed)
    weights = np.array([w for w, _, _ in _MIXTURE])
    component = rng.choice(len(_MIXTURE), size=n, p=weights / weights.sum())
    medians = np.array([m for _, m, _ in _MIXTURE])[component]
    sigmas = np.array([s for _, _, s in _MIXTURE])[component]
    lengths = np.exp(np.log(medians) + sigmas * rng.standard_normal(n))
    return np.clip(np.rint(lengths), 1, max_length).astype(np.int32)
