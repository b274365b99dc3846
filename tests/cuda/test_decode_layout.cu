// Host checks of what the NVFP4 non-flush kernel takes from the host (NonflushConstants, cuda/ssm/decode_replay.cuh)
// instead of deriving it in every warp. They need no GPU: the functions are __host__ __device__ and the library is
// built with --prec-div=true --fmad=false (cuda/CMakeLists.txt), so the host's float arithmetic is the device's.
//  - shared_layout's offsets, applied by carve_shared_at, give the regions carve_shared gives: the two layouts are
//    written twice (carve_shared stays pointer arithmetic for the kernels that keep it: session 36 measured that
//    rebuilding it from offsets moved their register allocation) and must not drift apart.
// (SmallDiv stays __device__ only: made __host__ __device__, one verification kernel's register allocation moved.)
#include <doctest/doctest.h>

#include <cstdint>
#include <vector>

#include "ssm/decode_replay.cuh"

using namespace replayssm::cuda::decode_detail;

namespace {

// Offset of p from base in floats, or -1 for nullptr.
long offset_of(const void* p, const float* base) {
  return p == nullptr ? -1 : static_cast<long>(reinterpret_cast<const float*>(p) - base);
}

}  // namespace

TEST_CASE("shared_layout + carve_shared_at give carve_shared's regions, within replay_shared_floats") {
  // Every window L = 1..64, key width 64/128/256, value width 1..256, heads a block 1..16, flush or not, bf16-sized
  // records or not: 3,145,728 layouts. The base is 16-byte aligned, as the kernels' extern shared array is.
  std::vector<float> room;
  long layouts = 0, differ = 0, overflow = 0;
  for (int L = 1; L <= 64; ++L)
    for (int DK : {64, 128, 256})
      for (int dv = 1; dv <= 256; ++dv)
        for (int NH = 1; NH <= 16; ++NH)
          for (bool flush : {false, true})
            for (bool bf16 : {false, true}) {
              const std::size_t floats = replay_shared_floats(L, DK, dv, NH, flush, bf16);
              if (room.size() < floats + 4) room.resize(2 * (floats + 4));
              float* const base = room.data();
              REQUIRE(reinterpret_cast<std::uintptr_t>(base) % 16 == 0);
              const ReplayShared a = carve_shared(base, L, DK, dv, NH, flush, bf16);
              const SharedLayout o = shared_layout(L, DK, dv, NH, flush, bf16);
              const ReplayShared b = carve_shared_at(base, o);
              const bool same = a.stride == b.stride && a.key_stride == b.key_stride && a.keys == b.keys &&
                                a.fold == b.fold && a.query == b.query && a.vals == b.vals && a.a == b.a && a.w == b.w &&
                                a.beta == b.beta && a.c1 == b.c1 && a.c2 == b.c2 && a.rows1 == b.rows1 &&
                                a.rows2 == b.rows2 && a.gamma == b.gamma && a.scratch == b.scratch &&
                                a.skip == b.skip && a.mma_b == b.mma_b;
              if (!same && differ++ < 5)
                FAIL_CHECK("L=" << L << " dk=" << DK << " dv=" << dv << " NH=" << NH << " flush=" << flush
                                << " bf16=" << bf16 << ": mma_b at " << offset_of(a.mma_b, base) << " vs "
                                << offset_of(b.mma_b, base) << ", vals at " << offset_of(a.vals, base) << " vs "
                                << offset_of(b.vals, base));
              // The last region (the B table, or skip's NH flags in a flush block) ends within the allotted room.
              const long end = flush ? offset_of(a.skip, base) + NH
                                     : offset_of(a.mma_b, base) + static_cast<long>(mma_b_floats(false)) - 4;
              if (end > static_cast<long>(floats) && overflow++ < 5)
                FAIL_CHECK("L=" << L << " dk=" << DK << " dv=" << dv << " NH=" << NH << " flush=" << flush
                                << ": regions end at " << end << " floats, room " << floats);
              ++layouts;
            }
  CHECK(layouts == 64L * 3 * 256 * 16 * 2 * 2);
  CHECK(differ == 0);
  CHECK(overflow == 0);
}
