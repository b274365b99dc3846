#!/usr/bin/env bash
# Session 14's last device call: main with session 12's patches 1-2 (landed: lib_head) as one run of every
# target, and the conventional row split restricted to FP32 states (lib_conv32) against it.
# Pack: .device/pack14f.tar.xz (bin/ = the test binaries and bench of the conv32 build, lib_head/, lib_conv32/, sys/),
# with .device/peers_vllm.tar.xz. Run from the repository root:
#   bash experiments/bench/decode_2026-12-05/final_call.sh
source "$(dirname "$0")/device_common.sh"
unpack_pack .device/pack14f.tar.xz lib_head
HEAD=$A/lib_head$SYS; C32=$A/lib_conv32$SYS
LD_LIBRARY_PATH=$HEAD $B/replayssm-bench --version > $R/version.txt 2>&1; cat $R/version.txt
# run_test LIB NAME BINARY [ARGS]: one suite into test_NAME.txt; prints its summary; success status.
run_test() {
  local lib=$1 name=$2 bin=$3; shift 3; local t0=$SECONDS
  LD_LIBRARY_PATH=$lib timeout 240 $B/$bin "$@" > $R/test_$name.txt 2>&1
  echo "test $name rc=$? $((SECONDS-t0))s $(tail -n 3 $R/test_$name.txt | head -n 2 | tr '\n' ' ')"
  grep -q "Status: SUCCESS" $R/test_$name.txt && return 0
  grep -B5 -A25 "ERROR" $R/test_$name.txt | head -60; return 1
}
memcheck() {
  local lib=$1 name=$2 bin=$3 cases=$4 t0=$SECONDS
  LD_LIBRARY_PATH=$lib timeout 200 compute-sanitizer --tool memcheck $B/$bin -tc="$cases" > $R/memcheck_$name.txt 2>&1
  echo "memcheck $name rc=$? $((SECONDS-t0))s $(tail -n 1 $R/memcheck_$name.txt)"
}
bench() {  # bench LIB TAG ARGS...
  local lib=$1 tag=$2 t0=$SECONDS; shift 2
  LD_LIBRARY_PATH=$lib timeout 200 $B/replayssm-bench bench "$@" --csv $R/$tag.csv > $R/$tag.txt 2>&1
  echo "bench $tag rc=$? $((SECONDS-t0))s"
}
ALL="nemotron-3-super nemotron-3-nano-4b qwen3.5-4b qwen3.5-122b-a10b kimi-linear-48b-a3b"
# 1. main's kernels with patches 1-2: both suites whole, memcheck on the replay, verification and KDA cases.
ok=1
run_test $HEAD head test_decode_cuda || ok=0
run_test $HEAD head_kda test_decode_kda_cuda || ok=0
memcheck $HEAD head test_decode_cuda "*staggered windows*,*appendix F skipping*,*after verification commits*,*exactly representable*"
# 2. the FP32-only row split: its conventional cases (dv = 192 included), memcheck on them.
c32=1
run_test $C32 conv32 test_decode_cuda -tc="*conventional*" || c32=0
run_test $C32 conv32_kda test_decode_kda_cuda -tc="*conventional*" || c32=0
memcheck $C32 conv32 test_decode_cuda "*conventional*"
# 3. The run of record: every shape at B = 32 and 256 (two rounds of head, alternating with conv32 when it passed),
#    then B = 8, 64, 128 once, then vLLM 0.33.0 at B = 32, 64, 128, 256.
if [ $ok = 1 ]; then
  for round in 1 2; do
    bench $HEAD main_head_$round --shapes $ALL --batch 32 256 --window 16 --drafts 8
    [ $c32 = 1 ] && bench $C32 main_conv32_$round --shapes $ALL --batch 32 256 --window 16 --drafts 8
  done
  bench $HEAD small_head --shapes $ALL --batch 8 64 128 --window 16 --drafts 8
  if tar -C . -xJf .device/peers_vllm.tar.xz; then
    t0=$SECONDS; timeout 200 python3 scripts/bench_peers.py --peers vllm --batch 32 64 128 256 --window 16 \
      --csv $R/peers_vllm.csv > $R/peers_vllm.log 2>&1
    echo "vllm rc=$? $((SECONDS-t0))s"
  fi
fi
pack_results
