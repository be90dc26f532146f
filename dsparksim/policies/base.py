"""The verification-policy interface shared by the simulator and the torch runner.

A policy decides, each engine step, the verify length L[i] in 0..K of every decoding request. It sees numpy arrays
only, so the very same objects run inside the simulator and (later) inside the real torch engine.

Shapes: n = number of decoding requests this step, K = block size.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, ClassVar

import numpy as np

from dsparksim.policies.registry import no_arg


@dataclass
class StepContext:
    """Everything a policy may look at for one engine step.

    conf:        (n, K) float64 conditional confidences c[i,k] (k = column, 0-based for position k+1).
    survival:    (n, K) float64 s[i,k] = prod(conf[i,:k+1]); non-increasing along axis 1.
    request_ids: (n,) int64, stable ids (policies that keep per-request history key on these).
    base_tokens: int, tokens already in the target batch before any draft token is admitted:
                 n anchors (1 per decoding request) + prefill tokens scheduled in this step. M = base_tokens + sum(L).
    step_time:   vectorised cost, M (int array) -> seconds (float array) for this step, INCLUDING the
                 non-trimmable parts (draft time for this step's n requests, fixed overhead, context term).
    max_tokens:  the largest M this step may use (engine token budget / profile range). Policies never exceed it.
    true_accepted: (n,) int64 ground-truth accepted prefix length A[i] had all K been verified. None unless the
                 policy declares ``needs_oracle = True``; only the oracle bound may read it.
    drafted:     (n,) int64 positions each request's drafter proposed (early exit, 1..K), or None = all K. Positions
                 past drafted[i] carry confidence 0 and do not exist: a policy never counts them as candidates
                 (policies/_common.py: Ranking, candidate_budget, existing) and the engine caps L[i] at drafted[i].
    context:     (n,) int64 context tokens of each decoding request (prompt + generated), or None when the step
                 is priced without a long-context term. With ``qk_s`` > 0, ``step_time`` prices every extra verified
                 token at the mean context (the 1-D price: step_time(M) = base(M) + qk_s * (sum(context) +
                 (M - base_tokens) * mean(context))), while verifying L[i] drafts of request i really costs
                 qk_s * ((1 + L[i]) * context[i] + L[i] (L[i] + 1) / 2) (the engine's exact step price).
    qk_s:        seconds per decode query-key pair of the profile's long-context term (0 = none).
    """

    conf: np.ndarray
    survival: np.ndarray
    request_ids: np.ndarray
    base_tokens: int
    step_time: Callable[[np.ndarray], np.ndarray]
    max_tokens: int
    true_accepted: np.ndarray | None = None
    drafted: np.ndarray | None = None
    context: np.ndarray | None = None
    qk_s: float = 0.0

    @property
    def n(self) -> int:
        return int(self.conf.shape[0])

    @property
    def K(self) -> int:
        return int(self.conf.shape[1])


class Policy:
    """Base class. Subclasses set ``name`` and implement :meth:`choose`.

    Class attributes:
      drafter:      None = use the run's block drafter; a string (e.g. "mtp1") = this policy always runs with
                    that drafter's acceptance and drafting cost (and its own block size, see ``block_size``).
      block_size:   None = the run's K; an int forces K (mtp1 -> 1; none -> 0).
      needs_oracle: True if the policy reads ``StepContext.true_accepted`` (not realisable).
      reads_confidence: False if the policy never looks at the confidences (``StepContext.conf`` / ``survival``):
                    a ``--confidence`` choice has no effect on it and `run` refuses one given explicitly.
      drafts:       False = no speculation at all (the ``none`` policy): the run uses K = 0, no drafter and the
                    no-draft acceptance source, so it pays no drafting cost and reserves no draft KV slots.
    """

    name: ClassVar[str] = "base"
    drafter: ClassVar[str | None] = None
    block_size: ClassVar[int | None] = None
    needs_oracle: ClassVar[bool] = False
    drafts: ClassVar[bool] = True
    reads_confidence: ClassVar[bool] = True

    spec: str = "base"  # the exact spec string this instance was built from (set by the registry)

    def __init__(self) -> None:
        self.spec = self.name

    @classmethod
    def from_arg(cls, arg: str | None) -> "Policy":
        """Build from the text after ':' in the spec (None if absent). Default: the policy takes no argument."""
        no_arg(cls.name, arg)
        return cls()

    def reset(self, K: int, rng: np.random.Generator) -> None:
        """Called once before a run (K = the block size the run actually uses). Clear all history here."""

    def choose(self, ctx: StepContext) -> np.ndarray:
        """Return L: (n,) int64 verify lengths, 0 <= L[i] <= K, base_tokens + L.sum() <= max_tokens."""
        raise NotImplementedError

    def observe(self, request_ids: np.ndarray, verify_len: np.ndarray, accepted: np.ndarray) -> None:
        """Feedback after the step: what was verified and how many of those were accepted (a[i] <= L[i])."""

    def __repr__(self) -> str:
        return f"<policy {self.spec}>"
