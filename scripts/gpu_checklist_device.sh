#!/usr/bin/env bash
# The GPU checklist as ONE device call, on a bare lent machine (no network; its python3 holds CUDA torch):
#   1. installs the wheels scripts/device_kit.sh put in .whl/ (simpy) into /tmp/site; the project runs from the
#      copied working tree (the repo root is the current folder), and environment.txt says which files it imported;
#   2. runs scripts/gpu_checklist.sh under a time budget (CHECKLIST_BUDGET_S, default 520 s: a device call may
#      run 600 s and the packing below must still happen), each stage's start and end time in the log;
#   3. packs what it wrote into $OUT within the device tool's limits (<= 8 files, <= 2 folders down, names of
#      letters, digits, '.', '_' and '-'): the log, the profile, the validation report and error table, the builder
#      comparison, nvidia-smi's view, and everything else in one tarball.
# A stage killed by the budget leaves what the earlier stages wrote (the profile first, then the builder
# comparison, the validation last) and the log says which stage it was; nothing partial is renamed as complete.
#
#   bash scripts/gpu_checklist_device.sh          # on the device: CUDA, Qwen3-8B shape (needs $OUT)
#   OUT=/tmp/o bash scripts/gpu_checklist_device.sh --tiny   # here: the same packing around the CPU smoke test
set -uo pipefail
MODE=${1:-gpu}
DEST=${OUT:?gpu_checklist_device.sh: set OUT to the folder whose files come back}
BUDGET=${CHECKLIST_BUDGET_S:-520}
WORK=${CHECKLIST_WORK:-/tmp/checklist}
WHEELS=${CHECKLIST_WHEELS:-.whl}
export PYTHONUNBUFFERED=1
PYTHON=${PYTHON:-python3}
export PYTHON
rm -rf "$WORK" && mkdir -p "$WORK" "$DEST"
if compgen -G "$WHEELS/*.whl" > /dev/null; then
  "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$WHEELS"/*.whl \
    || { echo "gpu_checklist_device: installing $WHEELS/*.whl failed" | tee "$DEST/checklist.log"; exit 3; }
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
"$PYTHON" - <<'EOF' 2>&1 | tee "$WORK/environment.txt"
import platform, dsparksim, numpy, scipy, pandas, simpy
print("python", platform.python_version(), "dsparksim", dsparksim.__file__)
print("numpy", numpy.__version__, "scipy", scipy.__version__, "pandas", pandas.__version__, "simpy", simpy.__version__)
try:
    import torch
    print("torch", torch.__version__, "cuda", torch.cuda.is_available(),
          torch.cuda.get_device_name(0) if torch.cuda.is_available() else "-")
except ImportError as e:
    print("torch: not importable:", e)
EOF
command -v nvidia-smi > /dev/null && nvidia-smi >> "$WORK/environment.txt" 2>&1
timeout -k 15 "$BUDGET" bash scripts/gpu_checklist.sh "$WORK" $([[ "$MODE" == "--tiny" ]] && echo --tiny)
rc=$?
if [[ $rc -eq 124 || $rc -eq 137 ]]; then
  echo "== STOPPED: the checklist ran past its budget of $BUDGET s (exit $rc); the stages not marked done above are missing or incomplete" \
    | tee -a "$WORK/checklist.log"
elif [[ $rc -ne 0 ]]; then
  echo "== FAILED: scripts/gpu_checklist.sh exited $rc" | tee -a "$WORK/checklist.log"
fi
# pack: single files at the top (what a reader opens first), everything in one tarball
cp "$WORK/checklist.log" "$WORK/environment.txt" "$DEST/" 2>/dev/null
for f in "$WORK"/*.json "$WORK/builder_vs_measured.md"; do [[ -f "$f" ]] && cp "$f" "$DEST/"; done
[[ -f "$WORK/validation/REPORT.md" ]] && cp "$WORK/validation/REPORT.md" "$DEST/validation_REPORT.md"
[[ -f "$WORK/validation/errors.csv" ]] && cp "$WORK/validation/errors.csv" "$DEST/validation_errors.csv"
tar czf "$DEST/checklist_all.tgz" -C "$(dirname "$WORK")" "$(basename "$WORK")"
if [[ $(stat -c %s "$DEST/checklist_all.tgz") -gt 15000000 ]]; then   # a file comes back only under 16 MiB
  echo "== the whole tarball is over 15 MB: packed without the per-run folders (validation/runs)" | tee -a "$DEST/checklist.log"
  tar czf "$DEST/checklist_all.tgz" --exclude="$(basename "$WORK")/validation/runs" -C "$(dirname "$WORK")" "$(basename "$WORK")"
fi
ls -la "$DEST"
exit $rc
