# shellcheck shell=bash
# Sourced by the kit's host-side executables (ci/render, ci/bench, ci/smoke, ci/eval, ci/setup-test-env, ci/test,
# entrypoint/doctor): they run the host's python3, which must be 3.11 or newer (tomllib), and, for a tool that makes
# its own venv, able to make one (Debian and Ubuntu ship that apart, as python3-venv). Exit 127, as for a missing
# program, with the fix (README: Host prerequisites).
need_python() { # need_python TOOL [venv]
  local tool=$1 found
  found=$(python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null) || found="none"
  if ! python3 -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
    if [[ -n ${SUDO_USER:-} ]]; then # sudo runs secure_path's python3, not the one first on the user's PATH
      echo "$tool: error: python3 under sudo is ${found} (sudo resets PATH to its secure_path), the kit's host tools" \
        "need 3.11 or newer; fix: keep your PATH, sudo env \"PATH=\$PATH\" $tool ..., or install Python 3.11+ as" \
        "the system's python3" >&2
      exit 127
    fi
    echo "$tool: error: python3 is ${found}, the kit's host tools need 3.11 or newer; fix: install Python 3.11+" \
      "and put it first on PATH as python3 (Ubuntu 22.04: apt install python3.11-venv, then" \
      "python3.11 -m venv ~/py311 && export PATH=~/py311/bin:\$PATH)" >&2
    exit 127
  fi
  if [[ ${2:-} == venv ]] && ! python3 -c 'import ensurepip, venv' 2>/dev/null; then
    echo "$tool: error: python3 ${found} cannot make a venv (no ensurepip); fix: apt install python3-venv" \
      "(Debian, Ubuntu), or a python3 that has it first on PATH" >&2
    exit 127
  fi
}
