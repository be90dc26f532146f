#!/usr/bin/env bash
# Prepare, on THIS machine, what the GPU checklist needs on a bare device machine (nothing can be fetched there):
# wheels in .whl/ (ignored by git; the device tool's `carry` takes it along) of the base dependencies the device
# image lacks (KINDS.md's package list, read 2026-11-17: simpy only; numpy, scipy, pandas, matplotlib, tqdm,
# tokenizers and torch are there). The project itself runs from the working tree the device call copies (the
# checklist runs `python -m dsparksim.cli.main` in the repo root, which imports the checkout, as the tests do).
# Then, on the device (one call; see scripts/gpu_checklist_device.sh):
#   run(command="bash scripts/gpu_checklist_device.sh", carry=[".whl"], timeout_s=600)
#
#   scripts/device_kit.sh            # writes .whl/ in the repo root and prints its contents
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
SIMPY=${SIMPY_VERSION:-4.1.1}
mkdir -p .git/info
grep -qxF '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
rm -rf .whl && mkdir -p .whl
# pure-Python wheel: the same file serves the device's Python 3.12
$PY -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 -d .whl "simpy==$SIMPY"
n=$(ls .whl/*.whl | wc -l)
if [[ "$n" -ne 1 ]]; then echo "device_kit: expected 1 wheel in .whl, found $n" >&2; exit 1; fi
du -sh .whl
ls -1 .whl
