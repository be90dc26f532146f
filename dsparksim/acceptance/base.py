"""The acceptance-source interface: per request per step, K confidences and the true accepted prefix length.

Every source (parametric paper-calibrated model, trace replay, engine-log importers) implements
:class:`AcceptanceModel`. The engine keeps per-request state as opaque arrays owned by the model so draws are
vectorised over requests (no per-request Python calls per step).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

DOMAINS = ("math", "code", "chat")


@dataclass
class Block:
    """One step's draws for n requests.

    conf:     (n, K) float64 calibrated conditional confidences in [0, 1] (what the scheduler sees).
    accepted: (n,) int64 ground-truth accepted prefix length A[i] in 0..K had all K been verified.
    survival: (n, K) float64 cumulative product of conf along axis 1, or None (then the engine computes it).
    """

    conf: np.ndarray
    accepted: np.ndarray
    survival: np.ndarray | None = None   # cumprod of conf along positions, when the source already has it


class AcceptanceModel:
    """Base class for acceptance sources.

    Attributes: ``drafter`` (e.g. "dspark"), ``K`` (block size it yields), ``metadata`` (dict saved next to
    results: where the numbers came from and what an importer lost).

    Per-request state lives in the model, keyed by integer *slots* the engine hands out (0..capacity-1), so
    per-step work is fancy indexing over slot arrays.
    """

    drafter: str
    K: int
    metadata: dict[str, Any]
    # True if draw() on keyed rows (dsparksim.sim.streams.KeyedRows) computes each row from that row's draws and
    # its slot's start() state alone, changing no state: the engine may then draw a request's steps ahead in
    # blocks (dsparksim.sim.predraw), bit for bit the same values.
    keyed_rows_pure: bool = False

    def start(self, slots: np.ndarray, domains: np.ndarray, rng: np.random.Generator) -> None:
        """Begin new requests in these slots. domains: (len(slots),) array of domain strings."""
        raise NotImplementedError

    def draw(self, slots: np.ndarray, rng: np.random.Generator) -> Block:
        """Draw this step's block for the requests in ``slots`` (each slot advances one block)."""
        raise NotImplementedError

    def suspend(self, slots: np.ndarray) -> Any:
        """The per-request state of ``slots`` beyond what :meth:`start` gives (a request preempted by recompute
        gives up its slot and is started again on readmission), or None when there is none: a source whose draws
        are keyed by (request, step) alone needs nothing kept."""
        return None

    def resume(self, slots: np.ndarray, state: Any) -> None:
        """After :meth:`start` of a readmitted request: put back what :meth:`suspend` returned for it, so its draws
        go on from the step it had reached."""

    @property
    def confidence_head(self) -> bool:
        """False for a drafter without a confidence head (``metadata["confidence_head"]``, e.g. ``mtp``): the
        confidences it yields are not a signal, and policies that read them are refused."""
        return bool(self.metadata.get("confidence_head", True))

    def describe(self) -> dict[str, Any]:
        """Metadata for config.json / summary (source, drafter, K, calibration, what was lost)."""
        return dict(self.metadata)
