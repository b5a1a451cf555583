# shellcheck shell=bash
# Sourced first by every shell step of ci/ and by .ci/run: no step fails without a word. A command that fails where
# `set -e` would end the script prints, before the script exits, the step, the file and line, the function, the
# command and its status on stderr:
#   ci/build-image: FAILED at ci/build-image:244 in disk(): `used=$(du -s ...)` exited 1
# set -E carries the trap into functions and command substitutions (without it bash runs an ERR trap in neither, and
# a failing `x=$(...)` inside a function ends the script silently). A failure inside a command substitution or a
# subshell is reported there, marked "(in a subshell)", and again where its status fails the enclosing command.
# Where a failure is tested (if, while, ||, &&, !), bash runs no ERR trap, inside substitutions too: only real ends.
# A step that has said why it stops ends with `exit N` (no report follows); the report is for every other stop.
# inherit_errexit: a command substitution stops at its first failure, as the script around it would.
set -Eeuo pipefail
shopt -s inherit_errexit

on_error_root=$(cd -- "${BASH_SOURCE[0]%/*}/.." && pwd)
# The step: the executable as the checkout names it (ci/test, .ci/run), whatever folder it was called from.
on_error_step=$(realpath -m "$0" 2>/dev/null || printf '%s' "$0")
on_error_step=${on_error_step#"$on_error_root"/}

on_error() {
  local status=$? file=${BASH_SOURCE[1]:-$0} where=""
  file=$(realpath -m "$file" 2>/dev/null || printf '%s' "$file")
  file=${file#"$on_error_root"/}
  ((${#FUNCNAME[@]} > 2)) && where=" in ${FUNCNAME[1]}()"
  ((BASH_SUBSHELL > 0)) && where+=" (in a subshell)"
  # shellcheck disable=SC2016 # the backquotes frame the command
  printf '%s: FAILED at %s:%s%s: `%s` exited %s\n' \
    "$on_error_step" "$file" "${BASH_LINENO[0]}" "$where" "$BASH_COMMAND" "$status" >&2
  return "$status"
}
trap on_error ERR
