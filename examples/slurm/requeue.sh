# Sourced by the sbatch scripts: requeue the job when its run was preempted.
#
#   summary_fingerprint RUN_DIR           the current run_summary.json's checksum ("" without one)
#   requeue_if_preempted CODE RUN_DIR BEFORE
#
# A run is preempted (and the job requeued with `scontrol requeue`) when `comlrl train` exited with
# REQUEUE_EXIT_CODE (85: stopped by SIGUSR1, SIGTERM or --time-limit after writing its checkpoint), or,
# under torchrun (whose own exit code is 1 whenever a training process exits non-zero), when the run's
# run_summary.json was rewritten by this attempt (its checksum is not BEFORE) and says
# "status": "preempted". A job already restarted MAX_RESTARTS times is not requeued again. Returns CODE
# when the job is not requeued, 0 when it is.

summary_fingerprint() {
    if [ -f "$1/run_summary.json" ]; then cksum < "$1/run_summary.json"; fi
}

requeue_if_preempted() {
    local code="$1" run_dir="$2" before="$3" restarts="${SLURM_RESTART_COUNT:-0}"
    local python="${COMLRL_PYTHON:-python}" status=""
    if [ "$(summary_fingerprint "$run_dir")" != "$before" ]; then
        status="$("$python" -c 'import json, sys; print(json.load(open(sys.argv[1])).get("status", ""))' \
            "$run_dir/run_summary.json" 2>/dev/null || true)"
    fi
    if [ "$code" -ne "${REQUEUE_EXIT_CODE:-85}" ] && [ "$status" != "preempted" ]; then
        echo "comlrl job ${SLURM_JOB_ID:-?}: training ended with exit code ${code} (run status: ${status:-unknown}); not requeued"
        return "$code"
    fi
    if [ "$restarts" -ge "${MAX_RESTARTS:-50}" ]; then
        echo "comlrl job ${SLURM_JOB_ID:-?}: preempted, but already restarted ${restarts} times (MAX_RESTARTS); not requeued"
        return "$code"
    fi
    echo "comlrl job ${SLURM_JOB_ID:-?}: preempted (exit code ${code}, run status: ${status:-not read}); requeueing (restart $((restarts + 1)))"
    scontrol requeue "$SLURM_JOB_ID"
}
