#!/usr/bin/env bash
# Session 2026-12-03 (5), call 5: strip the finished figure-12 file with a carried h5repack, then finish
# figure 13 and table 11 (resuming the cells the earlier calls left) while the budget lasts.
set -u
M=long_qwen3_5_ctx16k; R=$OUT/r; mkdir -p $R; X=experiments/results
export PATH=$PWD/.device/h5tools:$PATH
export LD_LIBRARY_PATH=$PWD/.device/b/lib:/usr/local/cuda/lib64:$PWD/.device/h5tools REPLAYSSM_SOURCE_DIR=$PWD
B=.device/b/bin
ls -la $X/*ctx16k* .device/b/bin/replayssm 2>&1 | head
python3 scripts/strip_positions.py $X/fig12_$M.h5 $R/fig12_${M}_summary.h5 || echo "strip fig12 failed"
COMMON="--text-dir .device/pg19 --device cuda --progress lines"
timeout ${T:-150} $B/replayssm kl-sweep data/models/$M --config experiments/table11.toml --seeds 0,1,2 $COMMON --out $X/table11_$M.h5 > $R/table11.log 2>&1 &
timeout ${T:-150} $B/replayssm kl-sweep data/models/$M --config experiments/fig13.toml $COMMON --out $X/fig13_$M.h5 > $R/fig13.log 2>&1 &
wait
for f in table11 fig13; do tail -2 $R/$f.log; python3 scripts/strip_positions.py $X/${f}_$M.h5 $R/${f}_${M}_summary.h5 || echo "strip $f failed"; done
ls -la $R
