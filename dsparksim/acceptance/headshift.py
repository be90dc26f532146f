"""A confidence head that does not fully see the domain, and STS fitted on a chosen traffic mix (study 2.2).

The parametric head (:mod:`.parametric`) reads each token's acceptance logit ``l`` through noise, so it knows the
domain's level exactly: moving traffic from chat to code changes nothing about its calibration. A real head is a
small network trained on one mix; on a domain it saw little of, it keeps part of the base rate it learned. Model:

    raw head logit = raw_gain * (l + noise - blind * (logit(alpha_{d,k}) - logit(alpha_{H,k})))

with alpha_{d,k} the conditional acceptance of domain d at position k and alpha_{H,k} that of the *head's mix* H
(the survival curves pooled with H's weights). ``blind`` = 0 is the original model; 1 = the head predicts every
domain at the head mix's per-position level, seeing only the variation within a domain. The bias is a label-shift
model (Saerens et al. 2002: a prior change moves the posterior log-odds by the change of the prior log-odds); its
size for a real head is not published and is a parameter of the study, not a fitted value.

``sts_mix``: the mix the simulator's sequential temperature scaling is fitted on (the calibration set); None =
every curve weighted equally (the default sampling). Acceptance draws never depend on any of this.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np

from dsparksim.errors import ConfigError

DOMAIN_ORDER = ("math", "code", "chat")   # the order of a mix written "M:C:H"


def parse_mix(text: str, source: str, name: str) -> tuple[float, float, float]:
    """'1:1:6' -> normalised (math, code, chat) weights; ConfigError naming ``name`` otherwise."""
    parts = str(text).split(":")
    try:
        w = [float(x) for x in parts]
    except ValueError:
        w = []
    if len(w) != 3 or not all(np.isfinite(x) and x >= 0 for x in w) or sum(w) <= 0:
        raise ConfigError(source, name, f"expected math:code:chat weights, three numbers >= 0 with a positive sum "
                          f"(e.g. 1:1:6), got {text!r}")
    t = sum(w)
    return tuple(float(x / t) for x in w)


@dataclass(frozen=True)
class HeadShift:
    """blind in [0, 1]; head_mix / sts_mix: normalised (math, code, chat) weights, or None for equal weights."""

    blind: float = 0.0
    head_mix: tuple[float, float, float] | None = None
    sts_mix: tuple[float, float, float] | None = None

    def __post_init__(self) -> None:
        if not (isinstance(self.blind, (int, float)) and np.isfinite(self.blind) and 0.0 <= self.blind <= 1.0):
            raise ConfigError("acceptance head shift", "head_blind", f"must be a number in [0, 1], got {self.blind!r}")

    @property
    def is_default(self) -> bool:
        return self.blind == 0.0 and self.sts_mix is None

    @classmethod
    def pop_from(cls, params: dict[str, str], source: str) -> "HeadShift | None":
        """Take ``head_blind``, ``head_mix`` and ``sts_mix`` out of spec query parameters (None if none given)."""
        if not any(k in params for k in ("head_blind", "head_mix", "sts_mix")):
            return None
        blind = params.pop("head_blind", "0")
        try:
            b = float(blind)
        except ValueError:
            raise ConfigError(source, "head_blind", f"expected a number in [0, 1], got {blind!r}") from None
        if not (np.isfinite(b) and 0.0 <= b <= 1.0):
            raise ConfigError(source, "head_blind", f"expected a number in [0, 1], got {blind!r}")
        hm = params.pop("head_mix", None)
        sm = params.pop("sts_mix", None)
        return cls(b, None if hm is None else parse_mix(hm, source, "head_mix"),
                   None if sm is None else parse_mix(sm, source, "sts_mix"))

    def _weights(self, mix, rows: Sequence[str]) -> np.ndarray:
        if mix is None:
            return np.full(len(rows), 1.0 / len(rows))
        w = np.array([dict(zip(DOMAIN_ORDER, mix)).get(d, 0.0) for d in rows])
        return w / w.sum() if w.sum() > 0 else np.full(len(rows), 1.0 / len(rows))

    def bias(self, curves: Mapping[str, np.ndarray], rows: Sequence[str], K: int, source: str) -> np.ndarray:
        """(rows, K) logit bias added to the raw head's logit of each curve row (see the module doc)."""
        if self.blind == 0.0 or len(rows) == 1:
            return np.zeros((len(rows), K))
        a = np.clip(np.vstack([np.asarray(curves[d][:K], float) for d in rows]), 1e-6, 1 - 1e-6)
        surv = np.cumprod(a, axis=1)
        w = self._weights(self.head_mix, rows)
        if w.sum() <= 0:
            raise ConfigError(source, "head_mix", "no weight on any domain of this model")
        pooled = w @ surv
        a_h = np.clip(pooled / np.concatenate(([1.0], pooled[:-1])), 1e-6, 1 - 1e-6)
        logit = np.log(a) - np.log1p(-a)
        return -self.blind * (logit - (np.log(a_h) - np.log1p(-a_h))[None, :])

    def sts_counts(self, rows: Sequence[str], per_curve: int) -> list[int]:
        """Blocks per curve row of the STS fitting sample: ``per_curve`` each, or the same total split by sts_mix."""
        if self.sts_mix is None:
            return [per_curve] * len(rows)
        w = self._weights(self.sts_mix, rows)
        return [int(round(len(rows) * per_curve * x)) for x in w]

    def describe(self) -> dict:
        return {"head_blind": self.blind, "head_mix": dict(zip(DOMAIN_ORDER, self.head_mix or (1 / 3,) * 3)),
                "sts_mix": dict(zip(DOMAIN_ORDER, self.sts_mix or (1 / 3,) * 3)),
                "model": "raw head logit += -head_blind * (logit alpha_{d,k} - logit alpha_{head_mix,k}); STS "
                         "temperatures fitted on sts_mix (dsparksim/acceptance/headshift.py)"}
