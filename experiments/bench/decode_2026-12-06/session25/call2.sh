#!/usr/bin/env bash
# Session 25, call 2 (about TOTAL = 480 s): call 1's script (call1.sh: suites, checked bench, A/B main / nolist /
# list) on pack .device/pack39.tar.xz (make_pack39.sh: the changes for call 2 in README.md). Same rule.
# -> $OUT/results.tar. Run from the repository root: TOTAL=480 bash experiments/bench/decode_2026-12-06/session25/call2.sh
PACK=.device/pack39.tar.xz exec bash experiments/bench/decode_2026-12-06/session25/call1.sh
