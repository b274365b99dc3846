#!/usr/bin/env bash
# Builds .device/pack40.tar.xz for session 25's third device call (README.md), from a configured CUDA build at the
# flush-list commit: bin/ (bench and GPU suites at that commit), sys/, lib_list (the commit's library) and lib_main
# (cuda/ as on main before the flush list, 30c687d = 3bc254a's kernels: the commit's cuda/ with the difference
# reverted). The bench binary runs both: BenchOptions keeps its layout for lib_main (flush_lists is its last field).
# Then, on the device: TOTAL=480 bash experiments/bench/decode_2026-12-06/session25/call3.sh
# Usage: bash experiments/bench/decode_2026-12-06/session25/make_pack40.sh [BUILD_DIR (default build-dev)]
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
source experiments/bench/decode_2026-12-05/pack_common.sh
pack_begin "${1:-build-dev}" make_pack40.sh
to_main=$(mktemp)
git diff HEAD 30c687d -- cuda/ssm cuda/bench > "$to_main"
pack_library lib_list
pack_library lib_main "$to_main"
rm -f "$to_main"
pack_end
(cd "$tmp" && tar -cf - bin sys lib_list lib_main) | xz -T1 --lzma2=preset=6,dict=96MiB > .device/pack40.tar.xz
ls -la .device/pack40.tar.xz
