"""The table `dsparksim sweep` prints: one row per finished cell, its axis values and headline metrics."""
from __future__ import annotations

from typing import Any

import pandas as pd

from dsparksim.results.notes import SHORT_LIST, short_window_list

# (results.csv column, header, format): what `frontier` also reports per cell
METRICS = (("output_throughput_tok_s", "out tok/s", "{:,.0f}"), ("tps_user_median", "tok/s/user p50", "{:.1f}"),
           ("ttft_p99_s", "TTFT p99 s", "{:.3f}"), ("tpot_median_s", "TPOT p50 ms", "{:.2f}"),
           ("tau", "tau", "{:.2f}"))


def _fmt(v: Any, fmt: str, scale: float = 1.0) -> str:
    if v is None or (isinstance(v, float) and v != v):
        return "-"
    return fmt.format(float(v) * scale) if isinstance(v, (int, float)) else str(v)


def sweep_text(table: pd.DataFrame) -> str:
    """Every finished cell (cell order): its `[axes]` values, then throughput, median per-user speed, p99 TTFT,
    median TPOT, tau; a saturated cell's throughput carries `*` (it measures the engine's limit, not the load);
    `-` = no finished request in the window. Empty string for an empty table."""
    if table.empty:
        return ""
    axes = [c for c in table.columns if c.startswith("cfg.")]
    head = [c[4:] for c in axes] + [h for _, h, _ in METRICS]
    rows = []
    for _, r in table.iterrows():
        row = [str(r[c]) for c in axes]
        for col, _, fmt in METRICS:
            v = r.get(col)
            s = _fmt(v, fmt, 1000.0 if col == "tpot_median_s" else 1.0)
            if col == "output_throughput_tok_s" and bool(r.get("saturated")) and s != "-":
                s += "*"
            row.append(s)
        rows.append(row)
    n_ax = len(axes)
    width = [max(len(h), *(len(x[i]) for x in rows)) for i, h in enumerate(head)]
    just = lambda i, s: s.ljust(width[i]) if i < n_ax else s.rjust(width[i])  # noqa: E731
    lines = ["  ".join(just(i, h) for i, h in enumerate(head))]
    lines += ["  ".join(just(i, s) for i, s in enumerate(x)) for x in rows]
    if "saturated" in table and table["saturated"].fillna(False).astype(bool).any():
        lines.append("* saturated: the engine could not keep up (results.csv saturated, saturation_detail)")
    return "\n".join(lines)


def _label(r: pd.Series, axes: list[str]) -> str:
    return f"cell {r['cell']}" + (f" ({', '.join(f'{c[4:]}={r[c]}' for c in axes)})" if axes else "")


def incomplete_notes(table: pd.DataFrame) -> list[str]:
    """Warning lines for cells whose metrics cover less than the workload (what `run` and `frontier` say of one run
    or cell, which a sweep left to its results.csv columns): requests rejected on arrival (the metrics cover only the
    admitted ones) and cells that finished no request in the window (empty metrics)."""
    if table.empty:
        return []
    axes = [c for c in table.columns if c.startswith("cfg.")]
    lines = []
    rej = table[table.get("num_requests_rejected", pd.Series(0, index=table.index)).fillna(0) > 0]
    if len(rej):   # a dozen cells named, the rest counted (short_window_list), as the short-window warning
        where = "results.csv: num_requests_rejected, rejected_by_reason"
        named = [f"{_label(r, axes)}: {int(r['num_requests_rejected'])} of {int(r['num_requests_issued'])}"
                 for _, r in rej.iterrows()]
        lines.append(f"dsparksim: warning: requests were rejected on arrival in {len(rej)} cell(s) and their metrics "
                     f"cover only the admitted requests: {short_window_list(named, where)}"
                     + (f" ({where})" if len(named) <= SHORT_LIST else ""))
    empty = table[table.get("num_requests_completed", pd.Series(1, index=table.index)).fillna(0) <= 0]
    if len(empty):
        named = [_label(r, axes) for _, r in empty.iterrows()]
        lines.append(f"dsparksim: warning: {len(empty)} cell(s) finished no request in the measurement window and "
                     f"have empty metrics: {short_window_list(named, 'results.csv: num_requests_completed 0')} "
                     "(lengthen duration_s)")
    return lines
