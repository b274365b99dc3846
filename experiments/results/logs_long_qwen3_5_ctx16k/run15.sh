#!/usr/bin/env bash
# Session 2026-12-03 (5), call 6: merge/finish figure 13 and figure 12 from the cells earlier calls left; strip.
set -u
M=long_qwen3_5_ctx16k; R=$OUT/r; mkdir -p $R; X=experiments/results
export PATH=$PWD/.device/h5tools:$PATH
export LD_LIBRARY_PATH=$PWD/.device/b/lib:/usr/local/cuda/lib64:$PWD/.device/h5tools REPLAYSSM_SOURCE_DIR=$PWD
B=.device/b/bin; COMMON="--text-dir .device/pg19 --device cuda --progress lines"
ls -a $X | grep ctx16k
timeout ${T:-55} $B/replayssm kl-sweep data/models/$M --config experiments/fig13.toml $COMMON --out $X/fig13_$M.h5 > $R/fig13.log 2>&1 &
timeout ${T:-55} $B/replayssm kl-sweep data/models/$M --config experiments/fig5.toml --seeds 0,1,2 $COMMON --out $X/fig12_$M.h5 > $R/fig12.log 2>&1 &
wait
for f in fig13 fig12; do tail -1 $R/$f.log; python3 scripts/strip_positions.py $X/${f}_$M.h5 $R/${f}_${M}_summary.h5 || echo "strip $f failed"; done
