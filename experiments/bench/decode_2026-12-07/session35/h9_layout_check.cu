// Host check of H9 (session 35): shared_layout's offsets give the pointers the pre-H9 carve_shared gave, for a 16-byte
// aligned base, over L = 1-64, dk = 64/128/256, dv = 1-253 (step 7), NH = 1-16, flush and not, bf16-sized records and
// not; and the B table stays within the room replay_shared_floats allots. Run here (no GPU) in a tree with
// h9_per_launch_constants.patch applied, from its root:
//   nvcc -std=c++17 --expt-relaxed-constexpr -I cuda -I src -isystem /usr/include/eigen3 \
//        -o h9_layout_check experiments/bench/decode_2026-12-07/session35/h9_layout_check.cu && ./h9_layout_check
// (session 35: "454656 cases, 0 differ"). The same check serves session 36's H9b (h9b_nvfp4_host_constants.patch,
// the same shared_layout): "454656 cases, 0 differ" there too.
#include "ssm/decode_replay.cuh"
#include <cstdio>
using namespace replayssm::cuda::decode_detail;
int main() {
  long bad = 0, cases = 0;
  for (int L = 1; L <= 64; ++L) for (int DK : {64, 128, 256}) for (int dv = 1; dv <= 256; dv += 7) for (int NH = 1; NH <= 16; ++NH)
  for (int flush = 0; flush < 2; ++flush) for (int bf = 0; bf < 2; ++bf) {
    const std::uintptr_t base = 4096;  // 16-byte aligned, as the kernel's extern array
    // The pre-H9 carve_shared, on addresses.
    std::uintptr_t keys = base;
    std::uintptr_t fold = keys + 4 * (flush ? std::size_t(L) * flush_key_stride(DK) : 0);
    std::uintptr_t query = fold + 4 * (flush ? std::size_t(kWarps) * kFoldRows * flush_key_stride(DK) : 0);
    std::uintptr_t vals = fold + 4 * (flush ? flush_fold_floats(DK) : 0);
    std::uintptr_t a = vals + 4 * replay_vals_floats(bf, L, dv, NH);
    std::uintptr_t w = a + 4 * NH * L, beta = w + 4 * NH * L, c1 = beta + 4 * NH * L, c2 = c1 + 4 * L, rows1 = c2 + 4 * L;
    std::uintptr_t rows2 = rows1 + 4 * NH * dv, gamma = rows2 + 4 * NH * dv, scratch = gamma + 4 * NH, skip = scratch + 4 * kWarps;
    std::uintptr_t after = skip + 4 * NH, mma_b = flush ? 0 : after + 4 * (((16 - after % 16) % 16) / 4);
    const SharedLayout o = shared_layout(L, DK, dv, NH, flush, bf);
    auto at = [&](int off) { return base + 4 * std::uintptr_t(off); };
    bool ok = at(o.fold) == fold && at(o.query) == query && at(o.vals) == vals && at(o.a) == a && at(o.w) == w &&
              at(o.beta) == beta && at(o.c1) == c1 && at(o.c2) == c2 && at(o.rows1) == rows1 && at(o.rows2) == rows2 &&
              at(o.gamma) == gamma && at(o.scratch) == scratch && at(o.skip) == skip &&
              (flush ? o.mma_b < 0 : at(o.mma_b) == mma_b) && o.stride == L && o.key_stride == flush_key_stride(DK);
    // Within the room replay_shared_floats allots.
    if (!flush) ok = ok && std::size_t(o.mma_b) + mma_b_floats(false) - 4 <= replay_shared_floats(L, DK, dv, NH, false, bf);
    bad += !ok; ++cases;
  }
  std::printf("%ld cases, %ld differ\n", cases, bad);
  return bad != 0;
}
