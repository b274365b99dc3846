#!/usr/bin/env bash
# Issue 11: table 11 and figure 13 (whose cells hold figure 12's whole set) on the retrained
# long_qwen3_5_ctx16k, at once; outputs in .device/sweeps (ignored: survive a warm machine's next call),
# stripped into $OUT in the same call. Carry: .device/run_sweeps_v2.sh .device/pack_sweep.tar.xz .device/pg19
# pack_sweep.tar.xz: scripts/gpu_pack.sh's pack of the CUDA build without its test binaries, plus h5repack and
# the libraries it needs (the device image has none), so the call stays under its 64 MiB.
set -u
M=long_qwen3_5_ctx16k; R=$OUT/r; mkdir -p $R .device/sweeps
[[ -d .device/b/bin ]] || { mkdir -p .device/b && tar -C .device/b -xJf .device/pack_sweep.tar.xz; }
export PATH=$PWD/.device/b/bin:$PATH LD_LIBRARY_PATH=$PWD/.device/b/lib:/usr/local/cuda/lib64 REPLAYSSM_SOURCE_DIR=$PWD
B=.device/b/bin; COMMON="--text-dir .device/pg19 --device cuda --progress lines"
$B/replayssm --version > $R/version.txt 2>&1; sha256sum data/models/$M/model.safetensors >> $R/version.txt
date -u >> $R/version.txt
timeout ${T:-500} $B/replayssm kl-sweep data/models/$M --config experiments/table11.toml --seeds 0,1,2 $COMMON --out .device/sweeps/table11_$M.h5 > $R/table11.log 2>&1 &
timeout ${T:-500} $B/replayssm kl-sweep data/models/$M --config experiments/fig13.toml $COMMON --out .device/sweeps/fig13_$M.h5 > $R/fig13.log 2>&1 &
wait; date -u >> $R/version.txt
for f in table11 fig13; do tail -1 $R/$f.log; python3 scripts/strip_positions.py .device/sweeps/${f}_$M.h5 $R/${f}_${M}_summary.h5 || echo "strip $f failed"; done
ls -la .device/sweeps $R
