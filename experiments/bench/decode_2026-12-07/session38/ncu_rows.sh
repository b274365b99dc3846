#!/usr/bin/env bash
# Nsight Compute on any row of the bench, chosen by its label (session 38's `bench --rows` and NVTX ranges), in place
# of session 33's ncu_read.sh, whose launch indices (--launch-skip 122, 110) hold for one row order only.
# ROWS: one entry a line, "shape;label;kernel" (kernel: the function name to profile in that row's NVTX range, e.g.
# replay_nonflush_kernel, kda_nonflush_kernel, replay_flush_kernel). B = 256, L = 16, T = 8 unless BATCH is set.
# First a check that the filter takes what it should: Nano's NVFP4 read at B = 32 (ncu's own list of the kernels in
# the range: the row's replay_nonflush_kernel and nothing of the FP32 read it is measured against).
# Carry a main pack (pack_common.sh's pack_main, .device/<pack>.tar.xz). Run from the repository root on the device:
#   PACK=.device/pack59.tar.xz TOTAL=300 ROWS="$(cat experiments/bench/decode_2026-12-07/session38/rows_h200.txt)" \
#     bash experiments/bench/decode_2026-12-07/session38/ncu_rows.sh
# -> $OUT/results.tar (r/<shape>_<n>_details.txt, _sass.csv, _bench.txt; summarise with session28/sass_blocks.py).
source experiments/bench/decode_2026-12-05/device_common.sh
TOTAL=${TOTAL:-300}; BATCH=${BATCH:-256}
unpack_pack ${PACK:?a main pack} lib_land
cat $A/bin/COMMIT > $R/pack_commit.txt; cat $R/gpu.txt
bench_cmd() {  # shape, batch, label: the row alone (and its references), no validation (ncu replays each kernel)
  echo $B/replayssm-bench bench --shapes "$1" --batch "$2" --window 16 --drafts 8 --repeats 3 --no-check --timer events \
    --arena-gib 16 --rows
}
range_of() { printf '%s/' "${1//\//|}"; }  # bench_row_range_name, then ncu's push/pop range syntax

# --rows itself (tests/python/test_cli_bench.py: its GPU cases skip without a GPU), where the image has pytest.
if python3 -c "import pytest" 2> /dev/null; then
  REPLAYSSM_BIN=$B/replayssm-bench LD_LIBRARY_PATH=$A/lib_land$SYS timeout 120 python3 -m pytest -q tests/python/test_cli_bench.py \
    > $R/pytest_cli_bench.txt 2>&1; echo "pytest test_cli_bench rc=$?: $(tail -n 1 $R/pytest_cli_bench.txt)"
else echo "no pytest in this image: test_cli_bench.py not run"; fi
# The check: every kernel launched in the NVFP4 read's range, listed by ncu without metrics.
label='non-flush read nvfp4 (x over fp32 read)'
LD_LIBRARY_PATH=$A/lib_land$SYS timeout -s INT 60 ncu --nvtx --nvtx-include "$(range_of "$label")" --metrics gpu__time_duration.sum \
  --kernel-name-base function $(bench_cmd nemotron-3-nano-4b 32) "^non-flush read nvfp4" > $R/filter_check.txt 2>&1
check_rc=$?
# ncu prints each profiled launch as "  void <namespace>::<kernel><template args>(params) (grid)x(block), Context ...".
launches() { grep -E '^  .*_kernel.*\)x\(.*Context' "$1"; }
echo "filter check rc=$check_rc"; launches $R/filter_check.txt | sed -E 's/^ *(void )?//; s/\(ReplayArgs.*//' | sort | uniq -c
# If the range filter took nothing (ncu reading the label's parentheses or spaces otherwise than expected), fall back to
# launch indices within the --rows run: each timed row launches its kernel 6 times (3 warm-up samples, --repeats 3), and
# a read row follows the FP32 non-flush step, which launches the same kernel function first.
nvtx_ok=1; launches $R/filter_check.txt > /dev/null || { nvtx_ok=0; echo "NVTX filter took no kernel: launch indices instead"; }

n=0
while IFS=';' read -r shape label kernel; do
  [ -z "$shape" ] && continue
  n=$((n + 1)); name=${shape}_$n; t0=$SECONDS
  [ $((TOTAL - SECONDS)) -lt 45 ] && { echo "$name ($label) skipped (time)"; continue; }
  # The row's label as a regular expression for --rows: the whole label, its metacharacters escaped.
  pattern="^$(printf '%s' "$label" | sed 's/[][\.*^$()+?{}|]/\\&/g')\$"
  if [ $nvtx_ok = 1 ]; then filter=(--nvtx --nvtx-include "$(range_of "$label")"); skip=1
  else filter=(); skip=1; [[ $label == non-flush\ read* ]] && skip=7; fi
  LD_LIBRARY_PATH=$A/lib_land$SYS timeout -s INT 90 ncu --clock-control none --kernel-name-base function \
    "${filter[@]}" -k "regex:^$kernel\$" --launch-skip $skip --launch-count 1 $NCU_PROFILE -o $R/$name \
    $(bench_cmd "$shape" "$BATCH") "$pattern" > $R/${name}_bench.txt 2> $R/$name.log
  echo "$name rc=$? $((SECONDS-t0))s: $shape, $label, $kernel"
  echo "$shape;$label;$kernel" > $R/${name}_row.txt
  ncu_export $name "$kernel"
done <<< "${ROWS:?shape;label;kernel lines}"
pack_results
