#!/usr/bin/env bash
# Session 33: which targets have PTX's two-code FP4 conversion, cvt.rn.f16x2.e2m1x2 (the decode the NVFP4 reads do in
# ALU instructions on sm_90). Needs nvcc only (no GPU). Run from anywhere: bash .../session33/cvt_e2m1_check.sh
# Session 33's output (CUDA 13.0, V13.0.88): sm_90 and sm_90a refused ("Instruction 'cvt with .e2m1x2' not supported
# on .target 'sm_90a'"); sm_100a, sm_103a and sm_120a compiled.
set -u
dir=$(mktemp -d); trap 'rm -rf "$dir"' EXIT
cat > "$dir/t.cu" <<'CU'
#include <cstdint>
__global__ void k(const uint8_t* in, uint32_t* out) {
  uint32_t r;
  const uint16_t a = in[threadIdx.x];
  asm("{ .reg .b8 b; mov.b16 {b, _}, %1; cvt.rn.f16x2.e2m1x2 %0, b; }" : "=r"(r) : "h"(a));
  out[threadIdx.x] = r;
}
CU
nvcc --version | tail -1
for arch in 90 90a 100a 103a 120a; do
  if msg=$(nvcc -gencode arch=compute_$arch,code=sm_$arch -c "$dir/t.cu" -o "$dir/t.o" 2>&1); then
    echo "sm_$arch: compiled"
  else
    echo "sm_$arch: refused: $(echo "$msg" | grep -m1 error | sed 's/.*error *: *//')"
  fi
done
