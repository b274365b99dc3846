// Every one of the 2^32 float32 bit patterns through RTN FP16, BF16, E4M3 and E2M1, compared
// code for code with CUDA's own host-side conversion routines (cuda_fp16.h, cuda_bf16.h,
// cuda_fp8.h, cuda_fp4.h), plus every code's decoding. Multi-threaded over all cores.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <thread>
#include <vector>

#include "formats/element_formats.h"
#include "test_util.h"

#if REPLAYSSM_HAVE_CUDA_HEADERS
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp4.h>
#include <cuda_fp8.h>
#endif

using namespace replayssm::formats;

#if REPLAYSSM_HAVE_CUDA_HEADERS
namespace {

uint32_t cuda_encode(ElementFormat f, float x) {
  switch (f) {
    case ElementFormat::fp16: return static_cast<__half_raw>(__float2half_rn(x)).x;
    case ElementFormat::bf16: return static_cast<__nv_bfloat16_raw>(__float2bfloat16_rn(x)).x;
    case ElementFormat::e4m3: return __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3);
    case ElementFormat::e2m1: default: return __nv_cvt_float_to_fp4(x, __NV_E2M1, cudaRoundNearest);
  }
}

float cuda_decode(ElementFormat f, uint32_t code) {
  switch (f) {
    case ElementFormat::fp16: {
      __half_raw r;
      r.x = static_cast<unsigned short>(code);
      return __half2float(__half(r));
    }
    case ElementFormat::bf16: {
      __nv_bfloat16_raw r;
      r.x = static_cast<unsigned short>(code);
      return __bfloat162float(__nv_bfloat16(r));
    }
    case ElementFormat::e4m3: {
      __half_raw h = __nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(code), __NV_E4M3);
      return __half2float(__half(h));
    }
    case ElementFormat::e2m1: default: {
      __half_raw h = __nv_cvt_fp4_to_halfraw(static_cast<__nv_fp4_storage_t>(code), __NV_E2M1);
      return __half2float(__half(h));
    }
  }
}

const char* name_of(ElementFormat f) {
  switch (f) {
    case ElementFormat::fp16: return "fp16";
    case ElementFormat::bf16: return "bf16";
    case ElementFormat::e4m3: return "e4m3";
    default: return "e2m1";
  }
}

}  // namespace

TEST_CASE("RTN encode equals CUDA host conversion on all 2^32 float32 inputs") {
  const unsigned threads = std::max(1u, std::thread::hardware_concurrency());
  constexpr ElementFormat kFormats[] = {ElementFormat::fp16, ElementFormat::bf16, ElementFormat::e4m3, ElementFormat::e2m1};
  std::atomic<uint64_t> mismatches[4] = {0, 0, 0, 0};
  std::atomic<uint64_t> first_bad[4] = {~0ull, ~0ull, ~0ull, ~0ull};
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::thread> pool;
  const uint64_t total = 1ull << 32, chunk = total / threads + 1;
  for (unsigned t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      const uint64_t begin = t * chunk, end = std::min(total, begin + chunk);
      uint64_t local[4] = {0, 0, 0, 0};
      for (uint64_t b = begin; b < end; ++b) {
        const float x = bits_float(static_cast<uint32_t>(b));
        for (int k = 0; k < 4; ++k) {
          if (encode_element(kFormats[k], x) != cuda_encode(kFormats[k], x)) {
            if (local[k]++ == 0) {
              uint64_t expected = ~0ull;
              first_bad[k].compare_exchange_strong(expected, b);
            }
          }
        }
      }
      for (int k = 0; k < 4; ++k) mismatches[k] += local[k];
    });
  }
  for (auto& th : pool) th.join();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  for (int k = 0; k < 4; ++k) {
    const uint64_t bad = mismatches[k];
    std::printf("exhaustive %s: %llu of 2^32 inputs differ from CUDA", name_of(kFormats[k]), static_cast<unsigned long long>(bad));
    if (bad) {
      const float x = bits_float(static_cast<uint32_t>(first_bad[k].load()));
      std::printf(" (e.g. input bits 0x%08llx = %a: ours 0x%x, CUDA 0x%x)", static_cast<unsigned long long>(first_bad[k].load()),
                  x, encode_element(kFormats[k], x), cuda_encode(kFormats[k], x));
    }
    std::printf("\n");
    CHECK_MESSAGE(bad == 0, name_of(kFormats[k]));
  }
  std::printf("exhaustive sweep: 4 formats x 2^32 inputs on %u threads in %.1f s\n", threads, seconds);
}

TEST_CASE("decode equals CUDA's conversion back to float for every code") {
  for (ElementFormat f : {ElementFormat::fp16, ElementFormat::bf16, ElementFormat::e4m3, ElementFormat::e2m1}) {
    const uint32_t ncodes = 1u << small_float_spec(f).total_bits;
    uint32_t bad = 0;
    for (uint32_t c = 0; c < ncodes; ++c) {
      const float ours = decode_element(f, c), theirs = cuda_decode(f, c);
      const bool same = (ours != ours && theirs != theirs) || float_bits(ours) == float_bits(theirs);
      bad += !same;
    }
    INFO(name_of(f));
    CHECK(bad == 0);
  }
}
#else
TEST_CASE("exhaustive comparison with CUDA host conversions") {
  replayssm::test::skip_suite("CUDA headers (cuda_fp16.h, cuda_fp8.h, cuda_fp4.h) not found at configure time; "
                              "install the CUDA toolkit to run the exhaustive 2^32 regression");
}
#endif
