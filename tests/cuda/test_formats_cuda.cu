// GPU quantizers against the CPU reference and CUDA's device conversions, bit for bit.
// Skips (ctest SKIPPED, exit 77) on machines without a CUDA device.
#include <doctest/doctest.h>

#include <boost/random/mersenne_twister.hpp>
#include <boost/random/normal_distribution.hpp>
#include <boost/random/uniform_int_distribution.hpp>
#include <cstdio>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp4.h>
#include <cuda_fp8.h>
#include <limits>
#include <vector>

#include "cuda_check.h"
#include "formats/philox.h"
#include "formats/quantize_gpu.h"
#include "formats/self_check.h"
#include "test_util.h"

using namespace replayssm;
using namespace replayssm::formats;

namespace {

struct GpuGuard {
  GpuGuard() {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0)
      test::skip_suite("no CUDA device: GPU format tests run on the device machine (see README)");
    cudaDeviceProp prop{};
    REPLAYSSM_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    std::printf("GPU: %s (sm_%d%d)\n", prop.name, prop.major, prop.minor);
  }
};
const GpuGuard gpu_guard;

// ---- all 2^32 inputs: our device RTN vs CUDA's device conversions ----------------------------
__device__ uint32_t cuda_device_encode(int format, float x) {
  switch (format) {
    case 0: return __half_as_ushort(__float2half_rn(x));
    case 1: return __bfloat16_as_ushort(__float2bfloat16_rn(x));
    case 2: return __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3);
    default: return __nv_cvt_float_to_fp4(x, __NV_E2M1, cudaRoundNearest);
  }
}

__global__ void exhaustive_rtn_kernel(uint64_t begin, uint64_t count, unsigned long long* mismatches,
                                      unsigned long long* nan_mismatches, uint32_t* first_bad) {
  for (uint64_t t = blockIdx.x * static_cast<uint64_t>(blockDim.x) + threadIdx.x; t < count;
       t += static_cast<uint64_t>(gridDim.x) * blockDim.x) {
    const uint32_t bits = static_cast<uint32_t>(begin + t);
    const float x = __uint_as_float(bits);
    const bool is_nan = (bits & 0x7FFFFFFFu) > 0x7F800000u;
#pragma unroll
    for (int f = 0; f < 4; ++f) {
      const uint32_t ours = encode_element(static_cast<ElementFormat>(f), x);
      if (ours != cuda_device_encode(f, x)) {
        if (is_nan) {
          atomicAdd(&nan_mismatches[f], 1ull);
        } else {
          atomicAdd(&mismatches[f], 1ull);
          atomicMin(&first_bad[f], bits);
        }
      }
    }
  }
}

// Our encoder evaluated on the device, RTN and SR, for a list of inputs (compared with the host).
__global__ void encode_list_kernel(const float* x, uint64_t n, int format, RoundingMode mode, SrKey key, uint32_t* out) {
  const uint64_t i = blockIdx.x * static_cast<uint64_t>(blockDim.x) + threadIdx.x;
  if (i < n)
    out[i] = encode_element(static_cast<ElementFormat>(format), x[i], mode,
                            mode == RoundingMode::stochastic ? sr_random_word(key.seed, key.stream, i) : 0u);
}

const char* kFormatNames[] = {"fp16", "bf16", "e4m3", "e2m1"};

std::vector<float> test_matrix(std::size_t n, uint64_t seed, int flavour) {
  boost::random::mt19937_64 rng(seed);
  boost::random::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(n);
  const float scale = flavour == 0 ? 1.0f : flavour == 1 ? 1e-30f : flavour == 2 ? 1e30f : 3e-3f;
  for (auto& v : x) v = normal(rng) * scale;
  if (flavour == 3) {  // edge cases sprinkled in: zeros block, -0, subnormals, NaN, inf, huge outlier
    for (std::size_t i = 0; i < std::min<std::size_t>(n, 256); ++i) x[i] = 0.0f;
    if (n > 300) {
      x[257] = -0.0f;
      x[258] = std::numeric_limits<float>::denorm_min();
      x[259] = -1e-40f;
      x[300] = 2688.0f;
    }
    if (n > 1000) {
      x[700] = std::numeric_limits<float>::quiet_NaN();
      x[900] = -std::numeric_limits<float>::infinity();
    }
  }
  return x;
}

}  // namespace

TEST_CASE("device RTN equals CUDA's device conversions on all 2^32 inputs") {
  unsigned long long *d_mismatch, *d_nan;
  uint32_t* d_first;
  REPLAYSSM_CUDA_CHECK(cudaMalloc(&d_mismatch, 4 * sizeof(unsigned long long)));
  REPLAYSSM_CUDA_CHECK(cudaMalloc(&d_nan, 4 * sizeof(unsigned long long)));
  REPLAYSSM_CUDA_CHECK(cudaMalloc(&d_first, 4 * sizeof(uint32_t)));
  REPLAYSSM_CUDA_CHECK(cudaMemset(d_mismatch, 0, 4 * sizeof(unsigned long long)));
  REPLAYSSM_CUDA_CHECK(cudaMemset(d_nan, 0, 4 * sizeof(unsigned long long)));
  REPLAYSSM_CUDA_CHECK(cudaMemset(d_first, 0xFF, 4 * sizeof(uint32_t)));
  const uint64_t chunk = 1ull << 30;
  for (uint64_t begin = 0; begin < (1ull << 32); begin += chunk) {
    exhaustive_rtn_kernel<<<132 * 16, 256>>>(begin, chunk, d_mismatch, d_nan, d_first);
    REPLAYSSM_CUDA_CHECK_LAUNCH();
  }
  REPLAYSSM_CUDA_CHECK(cudaDeviceSynchronize());
  unsigned long long mismatch[4], nan[4];
  uint32_t first[4];
  REPLAYSSM_CUDA_CHECK(cudaMemcpy(mismatch, d_mismatch, sizeof mismatch, cudaMemcpyDeviceToHost));
  REPLAYSSM_CUDA_CHECK(cudaMemcpy(nan, d_nan, sizeof nan, cudaMemcpyDeviceToHost));
  REPLAYSSM_CUDA_CHECK(cudaMemcpy(first, d_first, sizeof first, cudaMemcpyDeviceToHost));
  for (int f = 0; f < 4; ++f) {
    std::printf("device exhaustive %s: %llu non-NaN and %llu NaN inputs differ from CUDA's device conversion", kFormatNames[f],
                mismatch[f], nan[f]);
    if (mismatch[f]) std::printf(" (first non-NaN input 0x%08x)", first[f]);
    std::printf("\n");
    CHECK_MESSAGE(mismatch[f] == 0, kFormatNames[f]);
  }
  // fp16/bf16 hardware cvt canonicalises NaN to 0x7FFF like the host path; e4m3 cvt and the e2m1
  // path may differ on NaN only (FORMATS.md) — reported above, not a definition of ours.
  CHECK(nan[0] == 0);
  CHECK(nan[1] == 0);
  cudaFree(d_mismatch);
  cudaFree(d_nan);
  cudaFree(d_first);
}

TEST_CASE("device encoder equals the host encoder, RTN and SR, on 2^24 random bit patterns per format") {
  const uint64_t n = 1ull << 24;
  boost::random::mt19937_64 rng(test::kBaseSeed + 100);
  std::vector<float> x(n);
  for (auto& v : x) v = bits_float(static_cast<uint32_t>(rng()));
  // Half of the inputs in each format's own range, where SR actually has two neighbours.
  boost::random::normal_distribution<float> normal(0.0f, 1.0f);
  for (uint64_t i = 0; i < n; i += 2) x[i] = normal(rng) * 100.0f;
  float* d_x;
  uint32_t* d_out;
  REPLAYSSM_CUDA_CHECK(cudaMalloc(&d_x, n * sizeof(float)));
  REPLAYSSM_CUDA_CHECK(cudaMalloc(&d_out, n * sizeof(uint32_t)));
  REPLAYSSM_CUDA_CHECK(cudaMemcpy(d_x, x.data(), n * sizeof(float), cudaMemcpyHostToDevice));
  std::vector<uint32_t> out(n);
  for (int f = 0; f < 4; ++f) {
    for (RoundingMode mode : {RoundingMode::nearest_even, RoundingMode::stochastic}) {
      const SrKey key{0xC0FFEE00000001ull + f, 0x100000000ull * (f + 1) + 5};
      encode_list_kernel<<<static_cast<unsigned>((n + 255) / 256), 256>>>(d_x, n, f, mode, key, d_out);
      REPLAYSSM_CUDA_CHECK_LAUNCH();
      REPLAYSSM_CUDA_CHECK(cudaMemcpy(out.data(), d_out, n * sizeof(uint32_t), cudaMemcpyDeviceToHost));
      uint64_t bad = 0;
      for (uint64_t i = 0; i < n; ++i) {
        const uint32_t host = encode_element(static_cast<ElementFormat>(f), x[i], mode,
                                             mode == RoundingMode::stochastic ? sr_random_word(key.seed, key.stream, i) : 0u);
        bad += host != out[i];
      }
      std::printf("device vs host %s %s: %llu of %llu differ\n", kFormatNames[f],
                  mode == RoundingMode::stochastic ? "sr" : "rtn", static_cast<unsigned long long>(bad),
                  static_cast<unsigned long long>(n));
      CHECK(bad == 0);
    }
  }
  cudaFree(d_x);
  cudaFree(d_out);
}

TEST_CASE("GPU container quantizers equal the CPU reference bit for bit (codes, scales, decoded)") {
  const std::pair<std::size_t, std::size_t> shapes[] = {{1, 128}, {3, 128}, {64, 128}, {80, 128}, {7, 384}, {128, 256}};
  int cases = 0;
  for (StorageFormat f : kAllStorageFormats) {
    for (Rounding r : {Rounding::rtn, Rounding::sr}) {
      for (const auto& shape : shapes) {
        const std::size_t rows = shape.first, cols = shape.second;
        for (int flavour = 0; flavour < 4; ++flavour) {
          const uint64_t seed = test::kBaseSeed + 1000 * cases + flavour;
          const auto x = test_matrix(rows * cols, seed, flavour);
          const SrKey key{seed * 0x9E3779B97F4A7C15ull, static_cast<uint64_t>(cases) << 33};
          const QuantizedMatrix cpu = quantize_matrix(x.data(), rows, cols, f, r, key);
          const QuantizedMatrix gpu = cuda::quantize_matrix_gpu(x.data(), rows, cols, f, r, key);
          CAPTURE(to_string(f));
          CAPTURE(to_string(r));
          CAPTURE(rows);
          CAPTURE(flavour);
          REQUIRE(gpu.payload == cpu.payload);
          REQUIRE(gpu.block_scale_codes == cpu.block_scale_codes);
          REQUIRE(gpu.block_scales.size() == cpu.block_scales.size());
          for (std::size_t b = 0; b < cpu.block_scales.size(); ++b)
            REQUIRE(float_bits(gpu.block_scales[b]) == float_bits(cpu.block_scales[b]));
          REQUIRE(float_bits(gpu.tensor_scale) == float_bits(cpu.tensor_scale));
          std::vector<float> y_cpu(rows * cols), y_gpu(rows * cols, -12345.0f);  // poisoned
          dequantize_matrix(cpu, y_cpu.data());
          cuda::dequantize_matrix_gpu(cpu, y_gpu.data());
          for (std::size_t i = 0; i < y_cpu.size(); ++i) {
            const bool both_nan = y_cpu[i] != y_cpu[i] && y_gpu[i] != y_gpu[i];
            REQUIRE((both_nan || float_bits(y_cpu[i]) == float_bits(y_gpu[i])));
          }
          ++cases;
        }
      }
    }
  }
  std::printf("GPU vs CPU containers: %d cases (7 formats x RTN/SR x 6 shapes x 4 input flavours) bit-equal\n", cases);
}

TEST_CASE("GPU quantizers reproduce the numpy/ml_dtypes golden file") {
  const auto results = check_golden_file(test::source_path("data/goldens/formats_v1.json"), cuda::quantize_matrix_gpu);
  int passed = 0;
  for (const auto& r : results) {
    INFO(r.name << ": " << r.detail);
    CHECK(r.passed);
    passed += r.passed;
  }
  std::printf("GPU golden: %d of %zu cases bit-equal\n", passed, results.size());
}
