#!/usr/bin/env bash
# One side-by-side run: for every workload, comlrl 1.4.3 (baseline), this project (ours) and the
# bare-compute floor, REPS times, interleaved so that machine drift hits all three alike.
#
#   bash bench/run_compare.sh [smol] [tiny] [hetero]        (default: all three)
#   ALGOS="magrpo iac-separate iac-shared maac madpo marlhf" bash bench/run_compare.sh smol
#   python bench/summarize.py "$OUT/results.jsonl"
#
# Environment (defaults in brackets):
#   BENCH_MODELS  folder with smollm2-135m-instruct, tiny-llama, tiny-hetero   [bench/models, built by bench/bench_models.py]
#   BASELINE_PY   interpreter with comlrl 1.4.3 (pip install comlrl==1.4.3 in a venv of its own)
#                 [none: the baseline rows are left out, with a note]
#   OURS_PY       interpreter with this project installed                      [.venv/bin/python of this checkout, else python3]
#   FLOOR_PY      interpreter for limit_bench.py (torch + transformers)        [$OURS_PY]
#   ALGOS [magrpo]  (any of: magrpo iac-separate iac-shared maac madpo marlhf; the floor runs for magrpo only)
#   REPS [3]  THREADS [2]  OUT [bench/results/compare-<time>]  FLOOR_ARGS (extra limit_bench flags) []
# Every run appends one JSON line to $OUT/results.jsonl, labelled <workload>:<algo>:<baseline|ours|floor>;
# each run's stdout/stderr go to $OUT/logs/. Run nothing else on the machine meanwhile.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(dirname "$HERE")"
BENCH_MODELS="${BENCH_MODELS:-$HERE/models}"
BASELINE_PY="${BASELINE_PY:-}"
if [ -x "$ROOT/.venv/bin/python" ]; then OURS_PY="${OURS_PY:-$ROOT/.venv/bin/python}"; else OURS_PY="${OURS_PY:-$(command -v python3)}"; fi
FLOOR_PY="${FLOOR_PY:-$OURS_PY}"
REPS="${REPS:-3}"
read -r -a ALGO_LIST <<< "${ALGOS:-magrpo}"
THREADS="${THREADS:-2}"
OUT="${OUT:-$HERE/results/compare-$(date +%Y%m%d-%H%M%S)}"
read -r -a FLOOR_EXTRA <<< "${FLOOR_ARGS:-}"

WORKLOADS=("$@")
[ ${#WORKLOADS[@]} -eq 0 ] && WORKLOADS=(smol tiny hetero)

[ -n "$BASELINE_PY" ] || echo "run_compare: BASELINE_PY is not set: no CoMLRL 1.4.3 rows (see the environment variables above)" >&2
for py in $BASELINE_PY "$OURS_PY" "$FLOOR_PY"; do
  [ -x "$py" ] || { echo "run_compare: interpreter $py not found (see the environment variables above)" >&2; exit 2; }
done
models_for() {  # workload -> --model flags
  case "$1" in
    smol) echo "--model $BENCH_MODELS/smollm2-135m-instruct" ;;
    tiny) echo "--model $BENCH_MODELS/tiny-llama" ;;
    hetero) echo "--model $BENCH_MODELS/tiny-llama --model $BENCH_MODELS/tiny-hetero" ;;
    *) echo "run_compare: unknown workload $1 (smol, tiny, hetero)" >&2; return 2 ;;
  esac
}
for workload in "${WORKLOADS[@]}"; do models_for "$workload" > /dev/null; done
for dir in smollm2-135m-instruct tiny-llama tiny-hetero; do
  [ -d "$BENCH_MODELS/$dir" ] || { echo "run_compare: building the bench models in $BENCH_MODELS" >&2;
    BENCH_MODELS="$BENCH_MODELS" "$OURS_PY" "$HERE/bench_models.py" > /dev/null || exit 2; break; }
done

mkdir -p "$OUT/logs"
COMMON=(--max-new-tokens 32 --num-prompts 4 --epochs 1 --threads "$THREADS")
algo_args() {  # algo -> script and its own flags (rollout buffers as in the shared harness: MAGRPO 2, AC 8)
  case "$1" in
    magrpo) echo "magrpo_bench.py --num-generations 4 --rollout-buffer-size 2" ;;
    iac-separate) echo "iac_bench.py --num-generations 4 --critic-mode separate --rollout-buffer-size 8" ;;
    iac-shared) echo "iac_bench.py --num-generations 4 --critic-mode shared --rollout-buffer-size 8" ;;
    maac) echo "maac_bench.py --num-generations 4 --rollout-buffer-size 8" ;;
    madpo) echo "madpo_bench.py --num-candidates 8 --pairs-per-sample 4" ;;  # MADPO has no num_generations
    marlhf) echo "marlhf_bench.py --num-candidates 8 --pairs-per-sample 4 --num-generations 4" ;;
    *) echo "run_compare: unknown algo $1 (magrpo, iac-separate, iac-shared, maac, madpo, marlhf)" >&2; return 2 ;;
  esac
}
for algo in "${ALGO_LIST[@]}"; do algo_args "$algo" > /dev/null; done
FAILED=0

run() {  # label, interpreter, script, flags...
  local label="$1" py="$2" script="$3"; shift 3
  local log="$OUT/logs/${label//:/_}.$rep"
  echo "[$(date +%H:%M:%S)] $label rep $rep" >&2
  if ! "$py" "$HERE/$script" "$@" --seed "$rep" --label "$label" --json-out "$OUT/results.jsonl" \
      > "$log.out" 2> "$log.err"; then
    echo "FAILED: $label rep $rep (see $log.err)" >&2
    FAILED=1
  fi
}

for workload in "${WORKLOADS[@]}"; do
  read -r -a MODELS <<< "$(models_for "$workload")"
  for rep in $(seq 1 "$REPS"); do
    for algo in "${ALGO_LIST[@]}"; do
      read -r -a SCRIPT <<< "$(algo_args "$algo")"
      [ -z "$BASELINE_PY" ] || run "$workload:$algo:baseline" "$BASELINE_PY" "${SCRIPT[@]}" "${MODELS[@]}" "${COMMON[@]}"
      run "$workload:$algo:ours" "$OURS_PY" "${SCRIPT[@]}" "${MODELS[@]}" "${COMMON[@]}"
      if [ "$algo" = magrpo ]; then
        run "$workload:$algo:floor" "$FLOOR_PY" limit_bench.py "${MODELS[@]}" "${COMMON[@]}" --num-generations 4 --rollout-buffer-size 2 "${FLOOR_EXTRA[@]}"
      fi
    done
  done
done
echo "results: $OUT/results.jsonl  (python $HERE/summarize.py $OUT/results.jsonl)" >&2
exit "$FAILED"
