#!/usr/bin/env bash
# Prints the path of a working pythonX.Y interpreter (`ci/find_python.sh 3.12`), or fails saying
# where it looked. A `python3.12` on PATH may be a pyenv shim that refuses to run when that
# version is not selected, so each candidate is run, not just found.
set -uo pipefail
want="${1:?usage: ci/find_python.sh X.Y}"
candidates=("python$want")
root="$(pyenv root 2>/dev/null || echo "${PYENV_ROOT:-$HOME/.pyenv}")"
for dir in "$root"/versions/"$want"*/bin; do candidates+=("$dir/python$want"); done
candidates+=("/usr/bin/python$want" "/usr/local/bin/python$want")
for candidate in "${candidates[@]}"; do
  if version="$("$candidate" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null)" \
      && [ "$version" = "$want" ]; then
    command -v "$candidate" 2>/dev/null || echo "$candidate"
    exit 0
  fi
done
echo "no working python$want: tried ${candidates[*]}" >&2
exit 1
