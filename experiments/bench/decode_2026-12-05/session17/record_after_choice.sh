#!/usr/bin/env bash
# Session 17, call 2: session 16's record_call.sh (both decode suites whole, memcheck, every paper shape at
# B = 32 and 256) under ab_call.sh's choice. A choice other than the control runs pack16's lib_exp with the two
# switches set: the library main would have once that variant lands with its template arguments fixed (the
# landing is checked SASS-identical to lib_exp's instances on the CPU). The control, or no choice on this
# machine (a fresh one), runs lib_land, main's library as it stands.
# Run from the repository root on the device machine: bash experiments/bench/decode_2026-12-05/session17/record_after_choice.sh
here=experiments/bench/decode_2026-12-05
choice=$(cat .device/choice.env 2>/dev/null)
case "$choice" in
  "" | "REPLAYSSM_KDA_FLUSH_VARIANT=0 REPLAYSSM_KDA_NONFLUSH_STAGED_ROWS=0") echo "choice: control (${choice:-none}): lib_land"; LIB=lib_land ;;
  *) echo "choice: $choice: lib_exp"; LIB=lib_exp; export $choice ;;
esac
LIB=$LIB bash $here/session16/record_call.sh
echo "$LIB $choice" > "$OUT/choice_used.txt"
