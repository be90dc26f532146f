"""Readers of the small JSON files `dsparksim train` writes beside the checkpoints (``training_log.json``,
``calibration.json``), shared by ``collect`` and ``report``. numpy-free and torch-free (``report`` runs without
torch); every failure is one :class:`~dsparksim.errors.InputError` naming the file and the field.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from dsparksim.errors import InputError
from dsparksim.io.textio import loads_json, read_text


def read_json_object(path: str | Path, what: str) -> dict[str, Any]:
    """The JSON object in ``path`` (a missing, unreadable or non-object file is an InputError)."""
    obj = loads_json(read_text(path, what), path)
    if not isinstance(obj, dict):
        raise InputError(path, None, f"expected a JSON object ({what}), got {type(obj).__name__}")
    return obj


def read_training_log(path: str | Path) -> dict[str, Any]:
    """``training_log.json``: a JSON object whose ``preset`` (when present) is a string."""
    log = read_json_object(path, "training log")
    if "preset" in log and not isinstance(log["preset"], str):
        raise InputError(path, "preset", f"expected a preset name (a string), got {log['preset']!r}")
    return log


def read_calibration(path: str | Path) -> dict[str, dict[str, Any]]:
    """``calibration.json``: ``{drafter: {"temperatures": [T_1..T_K], ...}}`` with every T a finite number > 0
    (STS divides logits by it: 0 or a negative T would invert or saturate the confidences)."""
    cal = read_json_object(path, "calibration file")
    for kind, v in cal.items():
        if not isinstance(v, dict):
            raise InputError(path, kind, f"expected an object with 'temperatures', got {v!r:.60}")
        temps = v.get("temperatures")
        if not isinstance(temps, list) or not temps:
            raise InputError(path, f"{kind}.temperatures", f"expected a non-empty list of temperatures, got "
                             f"{temps!r:.60}")
        for i, t in enumerate(temps):
            ok = isinstance(t, (int, float)) and not isinstance(t, bool) and math.isfinite(t) and t > 0
            if not ok:
                raise InputError(path, f"{kind}.temperatures[{i}]", f"expected a finite number > 0, got {t!r:.60}")
    return cal
