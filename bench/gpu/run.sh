#!/usr/bin/env bash
# The GPU benchmark of issue 12, unattended, in one go, within 8 minutes on one H200:
#   bash bench/gpu/run.sh [OUT.json] [gpu_bench.py flags...]
# Nothing is downloaded. CoMLRL 1.4.3 (and `datasets`, which it imports, with dill and multiprocess)
# are installed into bench/gpu/.deps from wheels in bench/gpu/wheels, both git-ignored (third-party packages are
# not kept in this repository). Fill it once on a machine with PyPI and carry it to the device run:
#   pip download --no-deps -d bench/gpu/wheels comlrl==1.4.3 datasets dill multiprocess
#   run(command="bash bench/gpu/run.sh $OUT/gpu_bench.json", carry=["bench/gpu/wheels"])
# The image's python3 and its
# torch / transformers / peft run both libraries. The JSON report is rewritten after every job, and a
# hard timeout stops the driver before 8 minutes whatever happens.
set -u
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
OUT="${1:-$HERE/gpu_bench.json}"
shift || true
PY="${PYTHON:-python3}"
DEPS_ROOT="${BENCH_DEPS:-$HERE/.deps}"  # git-ignored
DEPS="$DEPS_ROOT/site"
C143="$DEPS_ROOT/comlrl-1.4.3"
start=$(date +%s)
if ! "$PY" -c "import datasets" 2>/dev/null; then
  "$PY" -m pip install -q --no-index --no-deps --target "$DEPS" "$HERE"/wheels/datasets-*.whl "$HERE"/wheels/dill-*.whl \
    "$HERE"/wheels/multiprocess-*.whl || echo "run.sh: datasets not installed; the 1.4.3 rows will fail" >&2
fi
"$PY" -m pip install -q --no-index --no-deps --target "$C143" "$HERE"/wheels/comlrl-1.4.3-*.whl \
  || echo "run.sh: CoMLRL 1.4.3 not installed; its rows will fail" >&2
export PYTHONPATH="$DEPS${PYTHONPATH:+:$PYTHONPATH}"
"$PY" -c "import torch; print('device:', torch.cuda.get_device_name() if torch.cuda.is_available() else 'none', '| torch', torch.__version__)" >&2
used=$(( $(date +%s) - start ))
budget=$(( 450 - used ))
timeout --signal=TERM --kill-after=10 $(( budget + 20 )) "$PY" "$HERE/gpu_bench.py" --out "$OUT" --budget-s "$budget" \
  --comlrl143 "$C143" "$@"
status=$?
echo "run.sh: report in $OUT (exit $status, $(( $(date +%s) - start )) s)" >&2
exit $status
