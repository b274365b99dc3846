#!/usr/bin/env bash
# Builds what session19/call3.sh and call4.sh carry, on the build machine (nvcc, no GPU needed), from a configured
# CUDA build at HEAD (the build-dev configuration of ../session18/README.md):
#   .device/pack19.tar.xz     bin/ (bench and GPU suites, COMMIT), lib_land/ (main's library), sys/ (host libraries)
#   .device/pack19x.tar.xz    the same plus lib_exp/: the library built with nvfp4_lane_columns.patch applied
#   .device/peers_slim.tar.xz the peers' files bench_peers.py imports, from .peers (scripts/fetch_peers.sh); skipped,
#                             with a message, when .peers lacks them
# cuda/ is put back and rebuilt afterwards, so the build folder holds main's library again.
# Usage: bash experiments/bench/decode_2026-12-05/session19/make_packs.sh [BUILD_DIR (default build-dev)]
# The patches apply to 41c3ece (the lane columns landed in e39e803): run it from a checkout of that commit.
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
here=experiments/bench/decode_2026-12-05/session19
source experiments/bench/decode_2026-12-05/pack_common.sh
pack_begin "${1:-build-dev}" make_packs.sh
pack_library lib_land
(cd "$tmp" && tar -cJf - bin lib_land sys) > .device/pack19.tar.xz
pack_library lib_exp "$here"/nvfp4_lane_columns.patch
pack_end
(cd "$tmp" && tar -cJf - bin lib_land lib_exp sys) > .device/pack19x.tar.xz
fi_root=.peers/flashinfer-0.7.2
if [ -d .peers/vllm-0.33.0 ] && [ -d "$fi_root/flashinfer/data/aot" ] && ls .peers/wheels/apache_tvm_ffi-*cp312*.whl >/dev/null 2>&1; then
  # The modules load_flashinfer_checkpointing_ssu imports (python/replayssm_py/peers_flashinfer.py), not the
  # whole 160 MB extract.
  { find .peers/vllm-0.33.0 -type f
    find "$fi_root" -maxdepth 1 -type f
    find "$fi_root"/flashinfer -maxdepth 1 -type f -name '*.py'
    find "$fi_root"/flashinfer/jit "$fi_root"/flashinfer/mamba "$fi_root"/flashinfer/data/aot -type f
    # The module's config template and sources: without the template bench_peers.py stopped at Super (session
    # 20's call), without the sources too (session 21's first call: JitSpec reads them before loading the .so).
    find "$fi_root"/flashinfer/data/csrc -type f \( -name '*.jinja' -o -name 'checkpointing_ssu*' \)
    [ -d "$fi_root"/flashinfer/autotuner ] && find "$fi_root"/flashinfer/autotuner -type f -name '*.py'
    echo "$fi_root"/flashinfer/fused_moe/utils.py
    ls .peers/wheels/apache_tvm_ffi-*cp312*.whl; } | sort -u > "$tmp"/peers.list
  tar -cJf .device/peers_slim.tar.xz -T "$tmp"/peers.list
else
  echo "make_packs.sh: .peers lacks vLLM, FlashInfer's prebuilt module or the cp312 apache-tvm-ffi wheel:" \
       "run scripts/fetch_peers.sh (PYTHON=<a python with torch>) first; peers_slim.tar.xz not made" >&2
fi
ls -la .device/pack19.tar.xz .device/pack19x.tar.xz .device/peers_slim.tar.xz 2>/dev/null || true
