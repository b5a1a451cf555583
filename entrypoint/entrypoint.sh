#!/usr/bin/env bash
# Container entrypoint (PID 1): run supervisord, the one supervisor, and exit with the code its failure recorded.
#   entrypoint.sh            serve (the default): preflight, then the server, under supervisord.conf
#   entrypoint.sh download   download the weights into the model folder and check them (entrypoint/download)
#   entrypoint.sh gateway    the SGLang Model Gateway in front of the replicas (gateway/launch)
#   entrypoint.sh doctor     inspect the box: GPUs, MIG, PCIe links, topology, P2P, IOMMU, ACS, power (entrypoint/doctor)
#   entrypoint.sh CMD ...    run CMD instead (e.g. entrypoint/launch --dry-run, bash)
# Exit codes (common/report.py): 2 arguments after serve, 3 when not even glm5.toml's state and log folders can be
# used; else, once stopped, the recorded failure's (3 invalid setting, 10-43 preflight, 70-76 a start the kit gave up
# on, one per failure kind: common/report.py FAILURES) or 0. After a failure supervisord and the exporter keep running
# until stopped (GLM5_ON_FAILURE=wait, the default).
set -Eeuo pipefail

GLM5_HOME=${GLM5_HOME:-$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd)}
export GLM5_HOME
readonly USAGE_EXIT=2
launch="$GLM5_HOME/entrypoint/launch"

log() { printf 'glm5-serve: %s\n' "$*" >&2; }

# Export the SV_* values supervisord.conf expands: glm5.toml and the overrides, an invalid one at its default
# (preflight records it); launch exits 3 only when even the default state or log folder cannot be used.
load_settings() {
  local lines key value
  lines=$("$launch" --supervisor-env)
  while IFS='=' read -r key value; do
    export "$key=$value"
  done <<<"$lines"
}

# supervisord as a child, so that SIGTERM/SIGINT reach it at any time (it drains the server, then stops the rest).
child=
on_stop() {
  log "stopping (drain bound ${SV_DRAIN_SECONDS:-the configured}s)"
  if [[ -n $child ]]; then
    kill -TERM "$child" 2>/dev/null || true
  fi
}

run_supervisor() {
  local status=0
  supervisord -c "$GLM5_HOME/entrypoint/supervisord.conf" &
  child=$!
  # wait returns early when a trapped signal arrives: wait again until supervisord has exited.
  while kill -0 "$child" 2>/dev/null; do
    status=0
    wait "$child" || status=$?
  done
  rm -f "$("$launch" --state-path server-config.yaml)" # the key's file, should the server have been killed first
  return "$status"
}

main() {
  if [[ ${1:-} == download || ${1:-} == doctor ]]; then
    exec "$GLM5_HOME/entrypoint/$1" "${@:2}"
  elif [[ ${1:-} == gateway ]]; then
    exec "$GLM5_HOME/gateway/launch" "${@:2}"
  elif [[ $# -gt 0 && $1 != serve ]]; then
    exec "$@"
  fi
  if [[ $# -gt 1 ]]; then
    log "error: serve takes no arguments (got: ${*:2}); put sglang flags in GLM5_EXTRA_ARGS"
    return "$USAGE_EXIT"
  fi
  trap on_stop TERM INT
  load_settings
  local status=0 code
  run_supervisor || status=$?
  code=$("$launch" --failed-code)
  if ((code != 0)); then
    return "$code"
  fi
  return "$status" # supervisord's own: 0 after a stop
}

if ! (return 0 2>/dev/null); then
  main "$@"
fi
