#!/usr/bin/env bash
# A refactoring's side-by-side check: the same bench scripts run by two checkouts' interpreters,
# interleaved (old, new per seed and algorithm) so that machine drift hits both alike. A pure move
# generates the same tokens and rewards on every seed; its CPU time should stay within noise.
#
#   OLD_PY=../old/.venv/bin/python NEW_PY=.venv/bin/python bash bench/pure_move.sh
#   python bench/pure_move_report.py "$OUT/results.jsonl"     # the table of docs/benchmarks.md
#
# Environment (defaults in brackets):
#   OLD_PY, NEW_PY   the two interpreters, each with its checkout installed (required)
#   MODEL            [$HOME/.cache/comlrl/models/smollm2-135m-instruct, the embedded default model's cache]
#   ALGOS [magrpo iac maac]  SEEDS [1 2 3]  THREADS [1]  OUT [bench/results/pure-move-<time>]
# The workload is the "smol" one of docs/benchmarks.md at one epoch over 4 prompts: 2 agents, K = 4,
# 32 new tokens (IAC with separate critics). Every run appends one JSON line to $OUT/results.jsonl.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
: "${OLD_PY:?set OLD_PY to the old checkout's interpreter}" "${NEW_PY:?set NEW_PY to the new checkout's interpreter}"
MODEL="${MODEL:-$HOME/.cache/comlrl/models/smollm2-135m-instruct}"
read -r -a ALGO_LIST <<< "${ALGOS:-magrpo iac maac}"
read -r -a SEED_LIST <<< "${SEEDS:-1 2 3}"
THREADS="${THREADS:-1}"
OUT="${OUT:-$HERE/results/pure-move-$(date +%Y%m%d-%H%M%S)}"
mkdir -p "$OUT/logs"
for seed in "${SEED_LIST[@]}"; do
  for algo in "${ALGO_LIST[@]}"; do
    case "$algo" in
      magrpo) script=(magrpo_bench.py);;
      iac) script=(iac_bench.py --critic-mode separate);;
      maac) script=(maac_bench.py);;
      *) echo "pure_move: unknown algorithm $algo (magrpo, iac, maac)" >&2; exit 2;;
    esac
    for side in old new; do
      if [ "$side" = old ]; then py="$OLD_PY"; else py="$NEW_PY"; fi
      log="$OUT/logs/$side-$algo-$seed"
      /usr/bin/time -f "%U %S" -o "$log.cpu" "$py" "$HERE/${script[0]}" "${script[@]:1}" --model "$MODEL" --num-agents 2 \
        --num-generations 4 --max-new-tokens 32 --num-prompts 4 --epochs 1 --seed "$seed" --threads "$THREADS" > "$log.out" 2> "$log.err"
      python3 - "$side" "$algo" "$seed" "$log" >> "$OUT/results.jsonl" <<'PY'
import json, sys
side, algo, seed, log = sys.argv[1:]
result = json.loads(open(log + ".out").read().strip().splitlines()[-1])
user, system = open(log + ".cpu").read().split()[-2:]
load = open("/proc/loadavg").read().split()[0]
print(json.dumps({"side": side, "algo": algo, "seed": int(seed), "cpu_s": float(user) + float(system), "load": load, "result": result}))
PY
    done
  done
done
echo "pure_move: $OUT/results.jsonl" >&2
