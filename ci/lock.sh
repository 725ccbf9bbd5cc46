#!/usr/bin/env bash
# Pins every package of a CI leg to the versions its venv last passed with, so that a release
# of a dependency (flax, transformers, numpy...) changes CI only when the pins are moved here
# on purpose. Each constraints file keeps its own hand-written pins above the "# Locked"
# line; what follows is `pip freeze` of the venv, less jax-amem and the hand-pinned packages.
#
#   bash ci/lock.sh                 # after the three legs passed (.venv, .venv-py312, .venv-vllm)
#   bash ci/lock.sh .venv ci/constraints.txt
set -euo pipefail
cd "$(dirname "$0")/.."

MARKER="# Locked: the rest, as the leg's venv last passed with them (bash ci/lock.sh)"

lock() {
  local venv="$1" file="$2"
  [[ -x "$venv/bin/python" ]] || { echo "ci/lock.sh: $venv has no python: run its CI leg first" >&2; exit 2; }
  local head pinned
  head="$(sed "/^# Locked/,\$d" "$file")"
  # Names pinned by hand (before the marker), lower-cased, '_' as '-'.
  pinned="$(printf '%s\n' "$head" | grep -v '^#' | sed 's/[<>=!~ ].*//' | tr 'A-Z_' 'a-z-' | grep -v '^$' || true)"
  {
    printf '%s\n%s\n' "$head" "$MARKER"
    "$venv/bin/python" -m pip freeze --exclude jax-amem | grep -v -e '^-e ' -e ' @ ' | while IFS= read -r line; do
      name="$(printf '%s' "${line%%==*}" | tr 'A-Z_' 'a-z-')"
      grep -qxF "$name" <<<"$pinned" || printf '%s\n' "$line"
    done
  } > "$file.new"
  mv "$file.new" "$file"
  echo "ci/lock.sh: $file: $(sed -n "/^# Locked/,\$p" "$file" | grep -vc '^#') packages locked from $venv"
}

if [[ $# -eq 2 ]]; then
  lock "$1" "$2"
else
  lock .venv ci/constraints.txt
  lock .venv-py312 ci/constraints-py312.txt
  lock .venv-vllm ci/constraints-vllm.txt
fi
