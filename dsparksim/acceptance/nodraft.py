"""The acceptance source of plain autoregressive decoding: nothing is drafted (K = 0).

Used by policies with ``drafts = False`` (the ``none`` policy): every step yields an empty block, so each decoding
request emits exactly its one bonus (target) token and nothing is verified, accepted or priced as drafting.
"""
from __future__ import annotations

import numpy as np

from dsparksim.acceptance.base import AcceptanceModel, Block


class NoDraftAcceptance(AcceptanceModel):
    """K = 0: confidences of shape (n, 0) and accepted prefix 0 for every request. Draws no random numbers."""

    drafter = "none"
    K = 0
    words_per_step = 1  # the engine hands every source keyed rows; this one reads none of them

    def __init__(self) -> None:
        self.metadata = {"source": "none", "kind": "no-draft", "drafter": "none", "K": 0,
                         "model": "plain autoregressive decoding: no draft tokens, one token per request per step"}

    def start(self, slots: np.ndarray, domains: np.ndarray, rng) -> None:
        """Nothing to remember per request."""

    def draw(self, slots: np.ndarray, rng) -> Block:
        n = int(np.asarray(slots).size)
        return Block(conf=np.zeros((n, 0)), accepted=np.zeros(n, dtype=np.int64))
