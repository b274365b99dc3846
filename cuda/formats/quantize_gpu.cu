#include "formats/quantize_gpu.h"

#include <vector>

#include "cuda_check.h"
#include "formats/philox.h"

namespace replayssm::cuda {

using formats::ElementFormat;
using formats::Rounding;
using formats::RoundingMode;
using formats::SrKey;
using formats::StorageFormat;

namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ uint32_t random_word(RoundingMode mode, SrKey key, uint64_t i) {
  return mode == RoundingMode::stochastic ? formats::sr_random_word(key.seed, key.stream, i) : 0u;
}

// fp32 / fp16 / bf16 / e4m3: one element per thread; e2m1: two elements (one byte) per thread.
__global__ void quantize_elements_kernel(const float* __restrict__ x, uint64_t n, StorageFormat format,
                                         RoundingMode mode, SrKey key, uint8_t* __restrict__ payload) {
  const uint64_t t = blockIdx.x * static_cast<uint64_t>(blockDim.x) + threadIdx.x;
  switch (format) {
    case StorageFormat::fp32:
      if (t < n) reinterpret_cast<float*>(payload)[t] = x[t];
      break;
    case StorageFormat::fp16:
    case StorageFormat::bf16: {
      if (t >= n) return;
      const ElementFormat ef = format == StorageFormat::fp16 ? ElementFormat::fp16 : ElementFormat::bf16;
      reinterpret_cast<uint16_t*>(payload)[t] =
          static_cast<uint16_t>(formats::encode_element(ef, x[t], mode, random_word(mode, key, t)));
      break;
    }
    case StorageFormat::e4m3:
      if (t < n) payload[t] = static_cast<uint8_t>(formats::encode_element(ElementFormat::e4m3, x[t], mode, random_word(mode, key, t)));
      break;
    case StorageFormat::e2m1: {
      const uint64_t i = 2 * t;
      if (i >= n) return;
      const uint32_t lo = formats::encode_element(ElementFormat::e2m1, x[i], mode, random_word(mode, key, i));
      const uint32_t hi = formats::encode_element(ElementFormat::e2m1, x[i + 1], mode, random_word(mode, key, i + 1));
      payload[t] = static_cast<uint8_t>(lo | (hi << 4));
      break;
    }
    default: break;
  }
}

// FP8 block-128: one warp per block; lane j owns elements j, j+32, j+64, j+96.
__global__ void quantize_fp8b128_kernel(const float* __restrict__ x, uint64_t n_blocks, RoundingMode mode, SrKey key,
                                        uint8_t* __restrict__ codes, float* __restrict__ scales) {
  const uint64_t block = (blockIdx.x * static_cast<uint64_t>(blockDim.x) + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (block >= n_blocks) return;  // whole warps exit together (n_blocks is per warp)
  const uint64_t base = block * formats::kFp8BlockSize;
  float v[4];
  formats::BlockAmax amax;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    v[j] = x[base + lane + 32 * j];
    formats::accumulate_amax(amax, v[j]);
  }
#pragma unroll
  for (int off = 16; off > 0; off /= 2) amax.amax = fmaxf(amax.amax, __shfl_xor_sync(0xFFFFFFFFu, amax.amax, off));
  amax.has_nonfinite = __any_sync(0xFFFFFFFFu, amax.has_nonfinite);
  const float s = formats::fp8b128_block_scale(amax);
  const float inv = formats::fp8b128_element_encode_scale(s);
  if (lane == 0) scales[block] = s;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const uint64_t i = base + lane + 32 * j;
    codes[i] = amax.has_nonfinite ? static_cast<uint8_t>(formats::kE4m3NanCode)
                                  : static_cast<uint8_t>(formats::encode_element(ElementFormat::e4m3, v[j] * inv, mode,
                                                                                 random_word(mode, key, i)));
  }
}

// NVFP4 pass 1: tensor amax over finite elements. Non-negative floats order like their bits.
__global__ void finite_amax_kernel(const float* __restrict__ x, uint64_t n, uint32_t* __restrict__ amax_bits) {
  float local = 0.0f;
  for (uint64_t i = blockIdx.x * static_cast<uint64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<uint64_t>(gridDim.x) * blockDim.x) {
    const float a = fabsf(x[i]);
    if (a < INFINITY && a > local) local = a;  // NaN compares false and is skipped
  }
#pragma unroll
  for (int off = 16; off > 0; off /= 2) local = fmaxf(local, __shfl_xor_sync(0xFFFFFFFFu, local, off));
  if (threadIdx.x % 32 == 0) atomicMax(amax_bits, __float_as_uint(local));
}

// NVFP4 pass 2: one thread per 16-element block, writing 8 packed bytes and one scale byte.
__global__ void quantize_nvfp4_kernel(const float* __restrict__ x, uint64_t n_blocks, RoundingMode mode, SrKey key,
                                      const uint32_t* __restrict__ amax_bits, uint8_t* __restrict__ packed,
                                      uint8_t* __restrict__ scale_codes, float* __restrict__ tensor_scale) {
  const uint64_t block = blockIdx.x * static_cast<uint64_t>(blockDim.x) + threadIdx.x;
  const formats::Nvfp4TensorScale ts = formats::nvfp4_tensor_scale(__uint_as_float(*amax_bits));
  if (block == 0) *tensor_scale = ts.decode;
  if (block >= n_blocks) return;
  const uint64_t base = block * formats::kNvfp4BlockSize;
  float v[formats::kNvfp4BlockSize];
  formats::BlockAmax amax;
#pragma unroll
  for (int j = 0; j < formats::kNvfp4BlockSize; ++j) {
    v[j] = x[base + j];
    formats::accumulate_amax(amax, v[j]);
  }
  uint32_t words[2] = {0u, 0u};
  if (amax.has_nonfinite) {
    scale_codes[block] = static_cast<uint8_t>(formats::kE4m3NanCode);
  } else {
    const uint32_t scale_code = formats::nvfp4_block_scale_code(amax.amax, ts);
    scale_codes[block] = static_cast<uint8_t>(scale_code);
    const float enc = formats::nvfp4_element_encode_scale(scale_code, ts);
#pragma unroll
    for (int j = 0; j < formats::kNvfp4BlockSize; ++j) {
      const uint32_t code = formats::encode_element(ElementFormat::e2m1, v[j] * enc, mode, random_word(mode, key, base + j));
      words[j / 8] |= code << (4 * (j % 8));
    }
  }
  uint2* dst = reinterpret_cast<uint2*>(packed + base / 2);
  *dst = make_uint2(words[0], words[1]);
}

__global__ void dequantize_kernel(DeviceQuantizedMatrix q, uint64_t n, StorageFormat format, float* __restrict__ out) {
  const uint64_t i = blockIdx.x * static_cast<uint64_t>(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  switch (format) {
    case StorageFormat::fp32: out[i] = reinterpret_cast<const float*>(q.payload)[i]; break;
    case StorageFormat::fp16:
      out[i] = formats::decode_element(ElementFormat::fp16, reinterpret_cast<const uint16_t*>(q.payload)[i]);
      break;
    case StorageFormat::bf16:
      out[i] = formats::decode_element(ElementFormat::bf16, reinterpret_cast<const uint16_t*>(q.payload)[i]);
      break;
    case StorageFormat::e4m3: out[i] = formats::decode_element(ElementFormat::e4m3, q.payload[i]); break;
    case StorageFormat::e2m1: out[i] = formats::decode_element(ElementFormat::e2m1, (q.payload[i / 2] >> (4 * (i % 2))) & 0xFu); break;
    case StorageFormat::fp8b128:
      out[i] = formats::fp8b128_decode_element(q.payload[i], q.block_scales[i / formats::kFp8BlockSize]);
      break;
    case StorageFormat::nvfp4:
      out[i] = formats::nvfp4_decode_element((q.payload[i / 2] >> (4 * (i % 2))) & 0xFu,
                                             q.block_scale_codes[i / formats::kNvfp4BlockSize], *q.tensor_scale);
      break;
  }
}

unsigned grid_for(uint64_t threads) { return static_cast<unsigned>((threads + kThreads - 1) / kThreads); }

template <class T>
struct DeviceBuffer {
  T* ptr = nullptr;
  explicit DeviceBuffer(std::size_t count) {
    if (count) REPLAYSSM_CUDA_CHECK(cudaMalloc(&ptr, count * sizeof(T)));
  }
  ~DeviceBuffer() {
    if (ptr) cudaFree(ptr);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
};

}  // namespace

void launch_quantize_matrix(const float* d_values, std::size_t rows, std::size_t cols, StorageFormat format,
                            Rounding rounding, SrKey key, DeviceQuantizedMatrix out, uint32_t* scratch_amax,
                            cudaStream_t stream) {
  const uint64_t n = static_cast<uint64_t>(rows) * cols;
  const RoundingMode mode = formats::element_rounding_mode(rounding);
  if (n == 0) return;
  switch (format) {
    case StorageFormat::fp8b128: {
      const uint64_t blocks = n / formats::kFp8BlockSize;
      quantize_fp8b128_kernel<<<grid_for(blocks * 32), kThreads, 0, stream>>>(d_values, blocks, mode, key, out.payload,
                                                                               out.block_scales);
      break;
    }
    case StorageFormat::nvfp4: {
      const uint64_t blocks = n / formats::kNvfp4BlockSize;
      REPLAYSSM_CUDA_CHECK(cudaMemsetAsync(scratch_amax, 0, sizeof(uint32_t), stream));
      const unsigned amax_grid = static_cast<unsigned>(std::min<uint64_t>(grid_for(n), 1024));
      finite_amax_kernel<<<amax_grid, kThreads, 0, stream>>>(d_values, n, scratch_amax);
      REPLAYSSM_CUDA_CHECK_LAUNCH();
      quantize_nvfp4_kernel<<<grid_for(blocks), kThreads, 0, stream>>>(d_values, blocks, mode, key, scratch_amax,
                                                                        out.payload, out.block_scale_codes,
                                                                        out.tensor_scale);
      break;
    }
    case StorageFormat::e2m1:
      quantize_elements_kernel<<<grid_for(n / 2), kThreads, 0, stream>>>(d_values, n, format, mode, key, out.payload);
      break;
    default:
      quantize_elements_kernel<<<grid_for(n), kThreads, 0, stream>>>(d_values, n, format, mode, key, out.payload);
      break;
  }
  REPLAYSSM_CUDA_CHECK_LAUNCH();
}

void launch_dequantize_matrix(const DeviceQuantizedMatrix& q, std::size_t rows, std::size_t cols, StorageFormat format,
                              float* d_out, cudaStream_t stream) {
  const uint64_t n = static_cast<uint64_t>(rows) * cols;
  if (n == 0) return;
  dequantize_kernel<<<grid_for(n), kThreads, 0, stream>>>(q, n, format, d_out);
  REPLAYSSM_CUDA_CHECK_LAUNCH();
}

formats::QuantizedMatrix quantize_matrix_gpu(const float* values, std::size_t rows, std::size_t cols,
                                             StorageFormat format, Rounding rounding, SrKey key) {
  const std::size_t n = rows * cols;
  formats::QuantizedMatrix q = formats::allocate_quantized_matrix(format, rows, cols);  // same checks and layout
  DeviceBuffer<float> d_x(n);
  DeviceBuffer<uint8_t> d_payload(q.payload.size()), d_scale_codes(q.block_scale_codes.size());
  DeviceBuffer<float> d_scales(q.block_scales.size()), d_tensor_scale(1);
  DeviceBuffer<uint32_t> d_amax(1);
  REPLAYSSM_CUDA_CHECK(cudaMemcpy(d_x.ptr, values, n * sizeof(float), cudaMemcpyHostToDevice));
  launch_quantize_matrix(d_x.ptr, rows, cols, format, rounding, key,
                         {d_payload.ptr, d_scale_codes.ptr, d_scales.ptr, d_tensor_scale.ptr}, d_amax.ptr, nullptr);
  REPLAYSSM_CUDA_CHECK(cudaDeviceSynchronize());
  REPLAYSSM_CUDA_CHECK(cudaMemcpy(q.payload.data(), d_payload.ptr, q.payload.size(), cudaMemcpyDeviceToHost));
  if (!q.block_scale_codes.empty())
    REPLAYSSM_CUDA_CHECK(cudaMemcpy(q.block_scale_codes.data(), d_scale_codes.ptr, q.block_scale_codes.size(),
                                    cudaMemcpyDeviceToHost));
  if (!q.block_scales.empty())
    REPLAYSSM_CUDA_CHECK(cudaMemcpy(q.block_scales.data(), d_scales.ptr, q.block_scales.size() * sizeof(float),
                                    cudaMemcpyDeviceToHost));
  if (format == StorageFormat::nvfp4)
    REPLAYSSM_CUDA_CHECK(cudaMemcpy(&q.tensor_scale, d_tensor_scale.ptr, sizeof(float), cudaMemcpyDeviceToHost));
  return q;
}

void dequantize_matrix_gpu(const formats::QuantizedMatrix& q, float* out) {
  const std::size_t n = q.size();
  DeviceBuffer<uint8_t> d_payload(q.payload.size()), d_scale_codes(q.block_scale_codes.size());
  DeviceBuffer<float> d_scales(q.block_scales.size()), d_tensor_scale(1), d_out(n);
  REPLAYSSM_CUDA_CHECK(cudaMemcpy(d_payload.ptr, q.payload.data(), q.payload.size(), cudaMemcpyHostToDevice));
  if (!q.block_scale_codes.empty())
    REPLAYSSM_CUDA_CHECK(cudaMemcpy(d_scale_codes.ptr, q.block_scale_codes.data(), q.block_scale_codes.size(),
                                    cudaMemcpyHostToDevice));
  if (!q.block_scales.empty())
    REPLAYSSM_CUDA_CHECK(cudaMemcpy(d_scales.ptr, q.block_scales.data(), q.block_scales.size() * sizeof(float),
                                    cudaMemcpyHostToDevice));
  REPLAYSSM_CUDA_CHECK(cudaMemcpy(d_tensor_scale.ptr, &q.tensor_scale, sizeof(float), cudaMemcpyHostToDevice));
  launch_dequantize_matrix({d_payload.ptr, d_scale_codes.ptr, d_scales.ptr, d_tensor_scale.ptr}, q.rows, q.cols,
                           q.format, d_out.ptr, nullptr);
  REPLAYSSM_CUDA_CHECK(cudaDeviceSynchronize());
  REPLAYSSM_CUDA_CHECK(cudaMemcpy(out, d_out.ptr, n * sizeof(float), cudaMemcpyDeviceToHost));
}

}  // namespace replayssm::cuda
