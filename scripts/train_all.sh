#!/usr/bin/env bash
# The one command that rebuilds the torch backend's artifacts from scratch (CPU, 2 threads):
#   tokenizer + target + four distilled drafters + STS calibration -> models/
#   acceptance traces of every drafter on held-out prompts          -> traces/real_*_k*.csv.gz
#   quality report (markdown + PNG)                                 -> models/report/
# Usage: scripts/train_all.sh [quick|full]   (quick = the committed checkpoints, ~20 min; full <= 45 min)
set -euo pipefail
PRESET="${1:-quick}"
cd "$(dirname "$0")/.."
dsparksim train --preset "$PRESET" --out models --threads 2    # --threads defaults to 1 (every torch command)
dsparksim collect --models models --out traces --threads 2
dsparksim report --models models --traces traces --out models/report
