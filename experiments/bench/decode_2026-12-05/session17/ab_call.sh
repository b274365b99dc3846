#!/usr/bin/env bash
# Session 17, call 1: session 16's flush_rows_call.sh as prepared (pack .device/pack16.tar.xz), then
# choose_variant.py on its bench CSVs. The choice is kept on the device machine (.device/choice.env, git-ignored)
# for record_after_choice.sh, the next call on the same warm machine, and returned as $OUT/choice.txt.
# Run from the repository root on the device machine: bash experiments/bench/decode_2026-12-05/session17/ab_call.sh
here=experiments/bench/decode_2026-12-05
bash $here/session16/flush_rows_call.sh
tmp=$(mktemp -d) && tar -C "$tmp" -xf "$OUT/results.tar"
python3 $here/session17/choose_variant.py "$tmp/r" | tee "$OUT/choice.txt"
tail -n 1 "$OUT/choice.txt" | grep "^REPLAYSSM_KDA_FLUSH_VARIANT=" > .device/choice.env || rm -f .device/choice.env
