#!/usr/bin/env bash
# Issue 13, session 11, call 5 (final): the NVFP4 read on the tensor cores and wider non-flush blocks (lib) against 75f8378 (lib_base): GPU
# tests, memcheck, A/B bench (B = 32, 256; 2 rounds alternating), B = 8-128 once each, then the peers
# (vLLM 0.33.0, FlashInfer 0.7.2) at B = 32, 256 in the same call.
set -u
R=$OUT/r; mkdir -p $R
mkdir -p .device/a && tar -C .device/a -xJf .device/pack8.tar.xz && tar -C . -xJf .device/peers.tar.xz
A=$PWD/.device/a; B=$A/bin
nvidia-smi --query-gpu=name,driver_version --format=csv > $R/gpu.txt 2>&1
SYS=""; if LD_LIBRARY_PATH=$A/lib ldd $B/replayssm-bench | grep -q "not found"; then SYS=":$A/sys"; fi
NEW=$A/lib$SYS; OLD=$A/lib_base$SYS
LD_LIBRARY_PATH=$NEW $B/replayssm-bench --version > $R/version.txt 2>&1; cat $R/version.txt
t0=$SECONDS; LD_LIBRARY_PATH=$NEW timeout 240 $B/test_decode_cuda > $R/test_decode_cuda.txt 2>&1; echo "test rc=$? $((SECONDS-t0))s $(tail -n 3 $R/test_decode_cuda.txt | head -n 2 | tr '\n' ' ')"
if ! grep -q "Status: SUCCESS" $R/test_decode_cuda.txt; then grep -B5 -A25 "ERROR" $R/test_decode_cuda.txt | head -80; fi
for round in 1 2; do
  t1=$SECONDS; LD_LIBRARY_PATH=$NEW timeout 150 $B/replayssm-bench bench --batch 32 256 --window 16 --drafts 8 --csv $R/main_new_$round.csv > $R/main_new_$round.txt 2>&1; echo "main new $round rc=$? $((SECONDS-t1))s"
  t1=$SECONDS; LD_LIBRARY_PATH=$OLD timeout 150 $B/replayssm-bench bench --batch 32 256 --window 16 --drafts 8 --csv $R/main_old_$round.csv > $R/main_old_$round.txt 2>&1; echo "main old $round rc=$? $((SECONDS-t1))s"
done
t1=$SECONDS; LD_LIBRARY_PATH=$NEW timeout 150 $B/replayssm-bench bench --batch 8 16 64 128 --window 16 --drafts 8 --csv $R/small_new.csv > $R/small_new.txt 2>&1; echo "small new rc=$? $((SECONDS-t1))s"
python3 -m pip install --no-deps --no-index .peers/wheels/apache_tvm_ffi-*cp312*.whl > $R/fi_setup.txt 2>&1; echo "tvm_ffi rc=$?"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" >> $R/fi_setup.txt 2>&1; tail -n 1 $R/fi_setup.txt
t1=$SECONDS; timeout 200 python3 scripts/bench_peers.py --peers vllm --shapes nemotron-3-super nemotron-3-nano-4b --batch 32 256 --window 16 --csv $R/peers_vllm.csv > $R/peers_vllm.log 2>&1; echo "vllm rc=$? $((SECONDS-t1))s"; tail -n 6 $R/peers_vllm.log
t1=$SECONDS; timeout 150 python3 scripts/bench_peers.py --peers flashinfer --shapes nemotron-3-super nemotron-3-nano-4b --batch 32 256 --window 16 --csv $R/peers_flashinfer.csv > $R/peers_flashinfer.log 2>&1; echo "flashinfer rc=$? $((SECONDS-t1))s"; tail -n 6 $R/peers_flashinfer.log
if grep -q "Status: SUCCESS" $R/test_decode_cuda.txt; then
  t1=$SECONDS; LD_LIBRARY_PATH=$NEW timeout 150 compute-sanitizer --tool memcheck $B/test_decode_cuda -tc="*staggered windows*,*appendix F skipping*,*after verification commits*,*verification kernels*" > $R/memcheck.txt 2>&1; echo "memcheck rc=$? $((SECONDS-t1))s"; tail -n 2 $R/memcheck.txt
fi
sed -i "s#$PWD#<repository>#g" $R/*.txt $R/*.log 2>/dev/null
xz -9 -T8 $R/*.txt $R/*.csv $R/*.log; tar -C $OUT -cf $OUT/results.tar r && rm -rf $R; ls -la $OUT
