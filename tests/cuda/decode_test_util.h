// What the decode kernels' GPU suites share (test_decode_cuda, test_decode_kda_cuda,
// test_prior_schemes_cuda): device buffers, the comparison of GPU values with their CPU reference,
// the stored-state and record buffers of the decode kernels, and the check that an LP copy is the
// RTN quantization of an FP32 HP copy, bit for bit.
#pragma once
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <cuda_bf16.h>
#include <string>
#include <vector>

#include "cuda_check.h"
#include "formats/quantized_matrix.h"
#include "ssm/decode_kernels.h"
#include "test_util.h"

namespace replayssm::test {

using cuda::DecodeShape;
using formats::StorageFormat;

template <class T>
struct DeviceArray {
  T* ptr = nullptr;
  std::size_t n = 0;
  explicit DeviceArray(std::size_t count) : n(count) {
    REPLAYSSM_CUDA_CHECK(cudaMalloc(&ptr, std::max<std::size_t>(1, count) * sizeof(T)));
    REPLAYSSM_CUDA_CHECK(cudaMemset(ptr, 0, std::max<std::size_t>(1, count) * sizeof(T)));
  }
  ~DeviceArray() { cudaFree(ptr); }
  DeviceArray(const DeviceArray&) = delete;
  void upload(const std::vector<T>& h) { REPLAYSSM_CUDA_CHECK(cudaMemcpy(ptr, h.data(), n * sizeof(T), cudaMemcpyHostToDevice)); }
  std::vector<T> download() const {
    std::vector<T> h(n);
    REPLAYSSM_CUDA_CHECK(cudaMemcpy(h.data(), ptr, n * sizeof(T), cudaMemcpyDeviceToHost));
    return h;
  }
};

// Every GPU value of a case and its CPU reference, compared at the end with the comparison rule of
// test_util.h relative to the case's RMS value: |gpu - cpu| <= tol (rms|cpu| + |cpu|), because a
// plain per-element relative error blows up on outputs that nearly cancel. A NaN (an unwritten,
// poisoned output) never matches.
struct Collected {
  std::vector<double> gpu, cpu;
  void add(const std::vector<float>& g, std::size_t offset, const std::vector<float>& ref) {
    gpu.insert(gpu.end(), g.begin() + static_cast<std::ptrdiff_t>(offset),
               g.begin() + static_cast<std::ptrdiff_t>(offset + ref.size()));
    cpu.insert(cpu.end(), ref.begin(), ref.end());
  }
  test::Closeness close(double tol, const std::string& what) const {
    return test::compare_close(gpu, cpu, {tol * test::rms(cpu.data(), cpu.size()), tol}, what);
  }
};

// Low-precision states: GPU and CPU each round their own FP32 update (or quantize their own recur
// checkpoint for the read copy, which the replay test checks bit for bit against the GPU's own);
// a 1-ulp difference there can flip one stored code, which moves every output that reads it by up
// to one code step. Elements outside `tol` are such flips: they are counted and reported, at most
// 0.1% of the elements may be, and every element stays within one code step, 0.25 (rms + |cpu|).
void check_with_flips(const Collected& meter, const test::Closeness& close, const std::string& what) {
  MESSAGE(what << ": " << close.mismatches << " of " << close.count << " elements beyond the FP32-path tolerance "
               << "(flipped low-precision codes)");
  INFO(close.report());
  CHECK(close.mismatches * 1000 <= close.count);
  CHECK_CLOSE(meter.close(0.25, what + " within one code step"));
}

struct StateBuffers {
  DeviceArray<uint8_t> payload, scale_codes;
  DeviceArray<float> block_scales, tensor_scales;
  cuda::DeviceState view;
  StateBuffers(StorageFormat f, const DecodeShape& s)
      : payload(formats::storage_bytes(f, 1, s.head_elements()) * s.heads()),
        scale_codes(f == StorageFormat::nvfp4 ? s.heads() * s.head_elements() / 16 : 0),
        block_scales(f == StorageFormat::fp8b128 ? s.heads() * s.head_elements() / 128 : 0),
        tensor_scales(f == StorageFormat::nvfp4 ? s.heads() : 0) {
    view.format = f;
    view.payload = payload.ptr;
    view.scale_codes = f == StorageFormat::nvfp4 ? scale_codes.ptr : nullptr;
    view.block_scales = f == StorageFormat::fp8b128 ? block_scales.ptr : nullptr;
    view.tensor_scales = f == StorageFormat::nvfp4 ? tensor_scales.ptr : nullptr;
  }
};

// decay_width: floats of one decay (KDA: dk; records.alpha is [B][cap][H][width]).
struct RecordBuffers {
  DeviceArray<__nv_bfloat16> k, v;
  DeviceArray<float> u, alpha, beta;
  DeviceArray<cuda::WindowState> w0, w1;
  cuda::DeviceRecords view;
  RecordBuffers(const DecodeShape& s, int capacity, const std::vector<cuda::WindowState>& initial, int decay_width = 1)
      : k(static_cast<std::size_t>(s.batch) * capacity * s.key_heads * s.dk),
        v(static_cast<std::size_t>(s.batch) * capacity * s.value_heads * s.dv),
        u(static_cast<std::size_t>(s.batch) * capacity * s.value_heads * s.dv),
        alpha(static_cast<std::size_t>(s.batch) * capacity * s.value_heads * decay_width),
        beta(static_cast<std::size_t>(s.batch) * capacity * s.value_heads), w0(s.batch), w1(s.batch) {
    // Empty records are neutral: a = 1, v = u = k = 0 (so staggered window positions need no history).
    std::vector<float> ones(alpha.n, 1.0f);
    alpha.upload(ones);
    w0.upload(initial);
    view = {capacity, k.ptr, v.ptr, u.ptr, alpha.ptr, beta.ptr, {w0.ptr, w1.ptr}, 0};
  }
};

// The LP copy of head `head` in `read` (downloaded once) against formats::quantize_matrix of the FP32
// HP values `hp` (dv x dk) with RTN: payload, block scales and tensor scale bit for bit.
struct ReadCopyHost {
  StorageFormat format;
  std::vector<uint8_t> payload, codes;
  std::vector<float> scales, tensor;
  explicit ReadCopyHost(const StateBuffers& read)
      : format(read.view.format), payload(read.payload.download()), codes(read.scale_codes.download()),
        scales(read.block_scales.download()), tensor(read.tensor_scales.download()) {}
  bool equals_quantized(const float* hp, int dv, int dk, std::size_t head) const {
    const auto q = formats::quantize_matrix(hp, dv, dk, format, formats::Rounding::rtn);
    auto at = [&](const auto& v, std::size_t per_head) { return v.begin() + static_cast<std::ptrdiff_t>(head * per_head); };
    bool same = std::equal(q.payload.begin(), q.payload.end(), at(payload, q.payload.size()));
    if (!q.block_scale_codes.empty())
      same = same && std::equal(q.block_scale_codes.begin(), q.block_scale_codes.end(), at(codes, q.block_scale_codes.size()));
    if (!q.block_scales.empty())
      same = same && std::equal(q.block_scales.begin(), q.block_scales.end(), at(scales, q.block_scales.size()));
    if (format == StorageFormat::nvfp4) same = same && q.tensor_scale == tensor[head];
    return same;
  }
};

}  // namespace replayssm::test
