#!/usr/bin/env bash
# The working tree travels with every device call (64 MiB in all with what `carry` names): `slim` moves tracked
# files over MIN_BYTES (default 150,000: plots, traces, data; 50,000 when a pack holds two libraries) to STASH (default ../slim_stash beside the repository, outside the tree
# that travels) so that tree + pack19x + peers_slim fit; `restore` puts them back. The limit counts disk blocks
# (2,828 small files take 18 MiB): with KEEP (path prefixes), `slim` also moves every tracked file outside them. Always restore after the call:
# the moved files read as deleted to git meanwhile.
# Usage: bash experiments/bench/decode_2026-12-05/session19/slim_tree.sh slim|restore
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
stash=$(realpath -m "${STASH:-../slim_stash}")
case ${1:-} in
  slim)
    # Checked before anything moves: a typo would otherwise move what the call needs, or stop halfway.
    case ${MIN_BYTES:-150000} in *[!0-9]*|"") echo "slim_tree.sh: MIN_BYTES must be a whole number of bytes, got '$MIN_BYTES'" >&2; exit 2 ;; esac
    for k in ${KEEP:-}; do
      [ -n "$(git ls-files -- "$k*" | head -n 1)" ] || { echo "slim_tree.sh: KEEP prefix '$k' matches no tracked file" >&2; exit 2; }
    done
    n=0
    while IFS= read -r -d '' f; do
      keep=1
      if [ -n "${KEEP:-}" ]; then  # KEEP: space-separated path prefixes; every other tracked file moves
        keep=0; for k in $KEEP experiments/bench/decode_2026-12-05/session19/slim_tree.sh; do case $f in "$k"*) keep=1 ;; esac; done
      fi
      if [ -f "$f" ] && { [ $keep = 0 ] || [ "$(stat -c %s "$f")" -gt "${MIN_BYTES:-150000}" ]; }; then
        mkdir -p "$stash/$(dirname "$f")" && mv "$f" "$stash/$f" && n=$((n + 1))
      fi
    done < <(git ls-files -z)
    echo "slim_tree.sh: moved $n files to $stash" ;;
  restore)
    [ -d "$stash" ] || { echo "slim_tree.sh: nothing to restore ($stash missing)"; exit 0; }
    (cd "$stash" && find . -type f -print0) | while IFS= read -r -d '' f; do
      mkdir -p "$(dirname "$f")" && mv "$stash/$f" "$f"
    done
    rm -rf "$stash"
    echo "slim_tree.sh: restored from $stash"; git status --short | head ;;
  *) echo "usage: slim_tree.sh slim|restore" >&2; exit 2 ;;
esac
