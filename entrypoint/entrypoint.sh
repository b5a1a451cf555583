#!/usr/bin/env bash
# Container entrypoint (PID 1): validate and preflight, then run the server under supervisord.
#   entrypoint.sh            serve (the default)
#   entrypoint.sh download   download the weights into the model folder and check them (entrypoint/download)
#   entrypoint.sh gateway    the SGLang Model Gateway in front of the replicas (gateway/launch)
#   entrypoint.sh doctor     inspect the box: GPUs, MIG, PCIe links, topology, P2P, IOMMU, ACS, power (entrypoint/doctor)
#   entrypoint.sh CMD ...    run CMD instead (e.g. entrypoint/launch --dry-run, bash)
# Exit codes (common/report.py): 2 arguments after serve, those of `launch --prepare` (3, 10-42),
# 70 when the server went FATAL, else supervisord's. After a failure it stays up until stopped
# (GLM5_ON_FAILURE=wait, the default), then exits with that code.
set -Eeuo pipefail

GLM5_HOME=${GLM5_HOME:-$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd)}
export GLM5_HOME
readonly FATAL_EXIT=70 USAGE_EXIT=2
fatal_file=
server_config=

log() { printf 'glm5-serve: %s\n' "$*" >&2; }

# Export the GLM5_* settings supervisord.conf expands, from glm5.toml and the overrides (launch exits 3 naming
# the setting and the fix when one is invalid, or when the state or log folder cannot be made or written).
load_settings() {
  local lines key value
  lines=$("$GLM5_HOME/entrypoint/launch" --supervisor-env)
  while IFS='=' read -r key value; do
    export "$key=$value"
  done <<<"$lines"
  fatal_file=$("$GLM5_HOME/entrypoint/launch" --state-path fatal)
  server_config=$("$GLM5_HOME/entrypoint/launch" --state-path server-config.yaml)
}

# Run a command as a child, so that a stop reaches it at any time (preflight, a download, supervisord):
# SIGTERM/SIGINT are passed on, and its exit status is returned once it has exited.
child=
stopping=false
run_child() {
  local status=0
  "$@" &
  child=$!
  if $stopping; then # a stop that came while it was being started
    kill -TERM "$child" 2>/dev/null || true
  fi
  # wait returns early when a trapped signal arrives: wait again until the child has exited.
  while kill -0 "$child" 2>/dev/null; do
    status=0
    wait "$child" || status=$?
  done
  child=
  return "$status"
}

on_stop() {
  stopping=true
  log "stopping (drain bound ${GLM5_DRAIN_SECONDS:-the configured}s)"
  if [[ -n $child ]]; then
    kill -TERM "$child" 2>/dev/null || true
  fi
}

# supervisord exits when stopped or when the server went FATAL (on-fatal records why).
run_supervisor() {
  local status=0
  run_child supervisord -c "$GLM5_HOME/entrypoint/supervisord.conf" || status=$?
  rm -f "$server_config" # the key's file, should the server have been killed before removing it
  if [[ -f $fatal_file ]]; then
    log "$(cat "$fatal_file")"
    return "$FATAL_EXIT"
  fi
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
  local status=0
  trap on_stop TERM INT
  load_settings
  if ! $stopping; then
    run_child "$GLM5_HOME/entrypoint/launch" --prepare || status=$?
  fi
  if $stopping; then
    log "stopped before the server started"
    return 0
  fi
  if ((status == 0)); then
    run_supervisor || status=$?
  fi
  if ((status != 0)) && ! $stopping; then
    stay_failed "$status"
  fi
  return "$status"
}

# A failure a restart cannot fix: stay up showing it (GLM5_ON_FAILURE=wait) until stopped, rather than exit
# into a restart policy that would reload the weights in a loop; the exit code is the same either way.
stay_failed() {
  if [[ $GLM5_ON_FAILURE == exit ]]; then
    return
  fi
  log "failed (exit code $1): staying up to show why (healthcheck --status; $(dirname "$fatal_file")/failed.json); fix the cause, then restart the container (GLM5_ON_FAILURE=exit exits instead)"
  while ! $stopping; do
    run_child sleep 3600 || true
  done
}

if ! (return 0 2>/dev/null); then
  main "$@"
fi
