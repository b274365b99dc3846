#!/usr/bin/env bash
# Session 2026-12-03 (5), call 4: figure 5/12 alone on data/models/$M (resumes a partial file if one is there).
set -u
M=${M:-long_qwen3_5_ctx16k}
R=$OUT/r; mkdir -p $R
[[ -d .device/b/bin ]] || { mkdir -p .device/b && tar -C .device/b -xJf .device/pack_full.tar.xz; }
B=.device/b/bin
export LD_LIBRARY_PATH=$PWD/.device/b/lib:/usr/local/cuda/lib64 REPLAYSSM_SOURCE_DIR=$PWD
ls -la experiments/results/*ctx16k* 2>&1 | head
X=experiments/results
timeout ${T:-270} $B/replayssm kl-sweep data/models/$M --config experiments/fig5.toml --seeds 0,1,2 --text-dir .device/pg19 --device cuda --progress lines --out $X/fig12_$M.h5 > $R/fig12.log 2>&1; echo "sweep exit $?"
tail -3 $R/fig12.log
python3 scripts/strip_positions.py $X/fig12_$M.h5 $R/fig12_${M}_summary.h5 || echo "strip failed"
