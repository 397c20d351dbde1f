# Sourced by the grid scripts (bash). run_workers N: start N copies of the caller's `worker`
# function in parallel (worker k gets k as $1; its output lines prefixed "[wk] "), 5 s apart so
# that they take different runs' locks first, and wait for all of them. Returns 1 when any
# worker returned non-zero (a run failed or is held by another live process), else 0.
run_workers() {
  local pids=() w pid status=0
  for ((w = 0; w < $1; w++)); do
    (set -o pipefail; worker "$w" 2>&1 | sed -u "s/^/[w$w] /") &
    pids+=($!)
    sleep 5
  done
  for pid in "${pids[@]}"; do wait "$pid" || status=1; done
  return $status
}
