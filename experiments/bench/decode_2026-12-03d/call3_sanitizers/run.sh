#!/usr/bin/env bash
# Session 2026-12-03 (5), call 3. Issue 11: figures 5/12, 13 and table 11 on the GDN hybrid trained with
# 16K contexts from the start (data/models/$M), the three sweeps at once on one GPU (each is a
# latency-bound scan of a 5.7 M-parameter model), then their position-stripped summaries.
# Issue 13, beside them: compute-sanitizer on the KDA kernels of this tree (47a072b + the reduce-scatter
# verification): memcheck with leak checking and racecheck.
# Carry: .device/run12.sh .device/pack_full.tar.xz .device/pg19 data/models/$M
set -u
M=${M:-long_qwen3_5_ctx16k}
R=$OUT/r; mkdir -p $R
mkdir -p .device/b && tar -C .device/b -xJf .device/pack_full.tar.xz
B=.device/b/bin
export LD_LIBRARY_PATH=$PWD/.device/b/lib:/usr/local/cuda/lib64 REPLAYSSM_SOURCE_DIR=$PWD
nvidia-smi --query-gpu=name,driver_version --format=csv > $R/gpu.txt 2>&1
$B/replayssm --version > $R/version.txt 2>&1
X=experiments/results
COMMON="--text-dir .device/pg19 --device cuda --progress lines"
t0=$SECONDS
timeout 540 $B/replayssm kl-sweep data/models/$M --config experiments/fig5.toml --seeds 0,1,2 $COMMON --out $X/fig12_$M.h5 > $R/fig12.log 2>&1 &
timeout 540 $B/replayssm kl-sweep data/models/$M --config experiments/fig13.toml $COMMON --out $X/fig13_$M.h5 > $R/fig13.log 2>&1 &
timeout 540 $B/replayssm kl-sweep data/models/$M --config experiments/table11.toml --seeds 0,1,2 $COMMON --out $X/table11_$M.h5 > $R/table11.log 2>&1 &
sweeps=$(jobs -p)
T=$B/test_decode_kda_cuda
timeout 420 compute-sanitizer --tool memcheck --leak-check full $T -tc="*shared fp32 and split*,*verification kernels equal*,*split-precision verification*,*after verification commits*" > $R/memcheck_kda.txt 2>&1 &
timeout 480 compute-sanitizer --tool racecheck $T -tc="*verification kernels equal*,*split-precision verification*" > $R/racecheck_kda_verify.txt 2>&1 &
timeout 480 compute-sanitizer --tool racecheck $T -tc="*shared fp32 and split*" > $R/racecheck_kda_replay.txt 2>&1 &
( while sleep 60; do echo "$((SECONDS-t0))s: $(for f in $R/fig12.log $R/fig13.log $R/table11.log; do tail -1 $f | cut -c1-60; done | tr '\n' '|')"; done ) &
mon=$!
for j in $sweeps; do wait $j; echo "sweep $j exit $? at $((SECONDS-t0))s"; done
wait $(jobs -p | grep -v "^$mon$") 2>/dev/null
kill $mon
for f in memcheck_kda racecheck_kda_verify racecheck_kda_replay; do echo "== $f"; grep -E "ERROR SUMMARY|LEAK SUMMARY|RACECHECK SUMMARY|Status|assertions|hazard" $R/$f.txt | tail -4; done
for f in fig12 fig13 table11; do
  python3 scripts/strip_positions.py $X/${f}_$M.h5 $R/${f}_${M}_summary.h5 || echo "strip $f failed"
done
tar -C $OUT -czf $OUT/results.tgz r && rm -rf $R
ls -la $OUT
