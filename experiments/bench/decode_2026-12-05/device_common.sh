# Sourced by this folder's device scripts (final_call.sh, main_call.sh, conv32b_call.sh), from the repository
# root on the device machine, with $OUT set by it.
#   unpack_pack PACK LIB: results folder $R; pack extracted to $A (binaries $B); $SYS is ":$A/sys" when the
#     image lacks a host library the binaries need (checked against $A/LIB), else empty; gpu.txt written.
#   run_peers END: vLLM (at most 120 s) and FlashInfer from .device/peers_slim.tar.xz at B = 32-256, L = 16,
#     until END seconds of the call ($SECONDS) -> $R/peers_*.
#   ab_rounds ARM: three A/B rounds of the bench, ARM and lib_land alternating (ARM first in odd rounds), Super and Nano
#     (AB_SHAPES: other shapes; AB_TIMEOUT: seconds a run, default 60) at B = 64, 128, 256 (AB_BATCH: other batches),
#     each configuration checked against the CPU decoders -> $R/ab_{ARM,lib_land}_{1,2,3}.{csv,txt}. AB_END (a $SECONDS
#     value): no run begun after AB_END - 15, none past AB_END, results snapshotted after each run.
#   snapshot_results: $OUT/results.tar from what $R holds now (call it after each step that took minutes).
#   NCU_PROFILE, ncu_export NAME KERNEL: Nsight Compute's sections and metrics for one launch; its report exported.
#   pack_results: repository paths replaced, files compressed, $OUT/results.tar.
# $R lives outside $OUT: at most 8 files come back from $OUT, so a call stopped at its time limit before
# pack_results returned 8 loose files of its dozens (session 31); with $R outside, $OUT holds only the last snapshot.
set -u
unpack_pack() {
  R=$PWD/.device/results/r; rm -rf $R; mkdir -p $R  # .device/ is git-ignored
  mkdir -p .device/a && tar -C .device/a -xJf "$1"
  # test_formats_cuda's golden file (1.2 MB) is among what slim_tree.sh leaves out of the tree that travels: carry
  # it as .device/formats_v1.json.xz (session 30: without it the suite's golden case fails).
  if [ ! -f data/goldens/formats_v1.json ] && [ -f .device/formats_v1.json.xz ]; then
    mkdir -p data/goldens && xz -dc .device/formats_v1.json.xz > data/goldens/formats_v1.json
  fi
  A=$PWD/.device/a; B=$A/bin
  SYS=""; LD_LIBRARY_PATH=$A/$2 ldd $B/replayssm-bench | grep -q "not found" && SYS=":$A/sys"
  nvidia-smi --query-gpu=name,driver_version --format=csv > $R/gpu.txt 2>&1
}
ab_rounds() {
  local round order l t0 limit
  for round in 1 2 3; do
    order="$1 lib_land"; [ $((round % 2)) = 0 ] && order="lib_land $1"
    for l in $order; do t0=$SECONDS; limit=${AB_TIMEOUT:-60}
      if [ -n "${AB_END:-}" ]; then  # a deadline: runs capped by it, none begun with under 15 s left, each snapshotted
        [ $((AB_END - SECONDS)) -lt 15 ] && { echo "ab $l round $round not run (time)"; continue; }
        [ $((AB_END - SECONDS)) -lt $limit ] && limit=$((AB_END - SECONDS))
      fi
      LD_LIBRARY_PATH=$A/$l$SYS timeout $limit $B/replayssm-bench bench --shapes ${AB_SHAPES:-nemotron-3-super nemotron-3-nano-4b} \
        --batch ${AB_BATCH:-64 128 256} --window 16 --drafts 8 --csv $R/ab_${l}_$round.csv > $R/ab_${l}_$round.txt 2>&1
      echo "ab $l round $round rc=$? $((SECONDS-t0))s"
      [ -n "${AB_END:-}" ] && snapshot_results
    done
  done
}
# Nsight Compute, one launch (session 33's ncu_read.sh, session 38's ncu_rows.sh): the sections and metrics every
# profile takes (scripts/ncu_floors.py reads what they give), then ncu_export NAME KERNEL turns $R/NAME.ncu-rep into
# $R/NAME_sass.csv (per-instruction SASS) and $R/NAME_details.txt, prints the launch's key figures, drops the report
# (tens of MB) and snapshots the results.
NCU_PROFILE="--section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats
  --section WarpStateStats --section SchedulerStats --section SourceCounters --section InstructionStats
  --metrics smsp__inst_executed.sum,dram__bytes_read.sum,dram__bytes_write.sum,gpu__time_duration.sum"
ncu_export() {
  ncu -i $R/$1.ncu-rep --page source --print-source sass --csv > $R/$1_sass.csv 2>> $R/$1.log
  ncu -i $R/$1.ncu-rep --page details --print-kernel-base demangled > $R/$1_details.txt 2>&1
  grep -m1 "$2" $R/$1_details.txt | cut -c1-200
  grep -E "Grid Size|Block Size|Duration|Registers|Executed Ipc A|Issue Slots Busy|Achieved Occupancy|Waves Per SM|DRAM Throughput|No Eligible|Dynamic Shared" \
    $R/$1_details.txt | head -20
  rm -f $R/$1.ncu-rep
  snapshot_results
}
snapshot_results() {  # uncompressed, paths as they are; replaced atomically, so a stop mid-write keeps the last one
  tar -C $(dirname $R) -cf $OUT/results.tar.part r && mv $OUT/results.tar.part $OUT/results.tar
}
pack_results() {
  sed -i "s#$PWD#<repository>#g" $R/*.txt $R/*.csv $R/*.log 2>/dev/null
  xz -9 -T8 $R/*.txt $R/*.csv $R/*.log 2>/dev/null
  snapshot_results && rm -rf $R; ls -la $OUT
}
run_peers() {
  local end=$1 left t0
  tar -C . -xJf .device/peers_slim.tar.xz
  left=$((end - SECONDS - 15))
  [ $left -gt 30 ] && { t0=$SECONDS; timeout $((left < 120 ? left : 120)) python3 scripts/bench_peers.py --peers vllm \
    --batch 32 64 128 256 --window 16 --csv $R/peers_vllm.csv > $R/peers_vllm.log 2>&1
    echo "vllm rc=$? $((SECONDS-t0))s"; tail -n 20 $R/peers_vllm.log; }
  python3 -m pip install --no-deps --no-index .peers/wheels/apache_tvm_ffi-*cp312*.whl > $R/fi_setup.txt 2>&1; echo "tvm_ffi rc=$?"
  left=$((end - SECONDS - 15))
  [ $left -gt 30 ] && { t0=$SECONDS; timeout $left python3 scripts/bench_peers.py --peers flashinfer --batch 32 64 128 256 \
    --window 16 --csv $R/peers_flashinfer.csv > $R/peers_flashinfer.log 2>&1
    echo "flashinfer rc=$? $((SECONDS-t0))s"; tail -n 12 $R/peers_flashinfer.log; }
}
