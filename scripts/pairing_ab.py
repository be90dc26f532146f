"""Normalisation A/B on a finished `dsparksim validate --out DIR`: each real run's steps normalised by step kind
(prefill-only steps by their paired prefill-only cells, mixed steps by their decode + prefill pair: what validate
does) against the decode pairs' factor for every step (what it did before 2026-12-02), on the same pairs.

    python scripts/pairing_ab.py DIR [DIR ...]

Prints per run the priced / measured step time - 1 under both, overall, for prefill-only and for mixed steps.
Both use validate's smoothing (runner.paired.smooth_factors, span 4) and the median over the repeats."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd

from dsparksim.runner.paired import smooth_factors


def _over(m, price, dt) -> str:
    return f"{100 * (price[m].sum() / dt[m].sum() - 1):+5.1f}" if m.any() else "  n/a"


def main(dirs: list[str]) -> int:
    for d in dirs:
        print("==", d)
        for real in sorted(Path(d).glob("runs/*/real")):
            st = pd.read_csv(real / "steps.csv")
            n = len(st)
            only = ((st.n_decode == 0) & (st.n_prefill_tokens > 0)).to_numpy()
            mixed = ((st.n_decode > 0) & (st.n_prefill_tokens > 0)).to_numpy()
            ratios = []
            for f in sorted(real.glob("paired_[0-9]*.csv")):
                rep = f.stem.split("_")[-1]
                dp = pd.read_csv(f)
                if dp.empty:
                    continue
                old = smooth_factors(dp.step.to_numpy(), dp.factor.to_numpy(), n, 4)
                new = old.copy()
                for kind, mask in (("prefill", only), ("mixed", mixed)):
                    g = real / f"paired_{kind}_{rep}.csv"
                    if g.is_file() and not (t := pd.read_csv(g)).empty:
                        new = np.where(mask, smooth_factors(t.step.to_numpy(), t.factor.to_numpy(), n, 4), new)
                ratios.append(new / old)          # dt_old = dt_raw / old = dt_new * new / old
            if not ratios:
                print(f"  {real.parent.name}: no paired steps")
                continue
            dt_new = st.dt.to_numpy()
            dt_old = dt_new * np.median(np.array(ratios), axis=0)
            price = st.dt_model.to_numpy()
            every = np.ones(n, bool)
            print(f"  {real.parent.name:16s} by step kind {_over(every, price, dt_new)}%  decode factor "
                  f"{_over(every, price, dt_old)}%   prefill-only {_over(only, price, dt_new)} / "
                  f"{_over(only, price, dt_old)}   mixed {_over(mixed, price, dt_new)} / {_over(mixed, price, dt_old)}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main(sys.argv[1:]))
