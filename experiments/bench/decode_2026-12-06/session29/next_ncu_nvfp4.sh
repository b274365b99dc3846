#!/usr/bin/env bash
# Session 29 (run in session 30's call 2): Nsight Compute on the NVFP4 reads that still missed 3.8x, on H4's library
# (pack49's lib_h4: Super's read at 16 heads per block) and on main's (lib_land), B = 256, L = 16: where the
# instructions per warp go (source page as SASS; summarise with session28/sass_blocks.py --warps N) and the usual
# sections. Session 30 ran it without the --arena-gib 8 this script first had (too small at B = 256). The steps are
# session 33's ncu_read.sh, which generalises this script (PACK, LIBS, SHAPES); this call's settings:
# -> $OUT/results.tar. Run from the repository root: TOTAL=300 bash experiments/bench/decode_2026-12-06/session29/next_ncu_nvfp4.sh
PACK=${PACK:-.device/pack49.tar.xz} LIBS=${LIBS:-"lib_h4 lib_land"} SHAPES=${SHAPES:-"nemotron-3-super nemotron-3-nano-4b"} \
  TOTAL=${TOTAL:-300} exec bash experiments/bench/decode_2026-12-07/session33/ncu_read.sh
