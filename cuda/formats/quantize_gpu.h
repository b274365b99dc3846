// GPU quantizers for whole state matrices, built from the same host/device definitions as the
// CPU reference (src/formats/*.h), so the codes are bit-identical by construction and by test.
//
// quantize_matrix_gpu has the signature of formats::quantize_matrix: one test calls both.
// The device-pointer entry points are what decode kernels use.
#pragma once
#include <cuda_runtime.h>

#include "formats/quantized_matrix.h"

namespace replayssm::cuda {

// Host arrays in and out; device work inside (allocates, copies, synchronises).
formats::QuantizedMatrix quantize_matrix_gpu(const float* values, std::size_t rows, std::size_t cols,
                                             formats::StorageFormat format, formats::Rounding rounding,
                                             formats::SrKey key = {});
void dequantize_matrix_gpu(const formats::QuantizedMatrix& q, float* out);

// Device buffers of one matrix in the layout of formats::QuantizedMatrix.
struct DeviceQuantizedMatrix {
  uint8_t* payload = nullptr;
  uint8_t* block_scale_codes = nullptr;  // nvfp4
  float* block_scales = nullptr;         // fp8b128
  float* tensor_scale = nullptr;         // nvfp4, one float
};

// `scratch_amax` is one uint32 of device memory (nvfp4 tensor amax), zeroed by the launcher.
void launch_quantize_matrix(const float* d_values, std::size_t rows, std::size_t cols, formats::StorageFormat format,
                            formats::Rounding rounding, formats::SrKey key, DeviceQuantizedMatrix out,
                            uint32_t* scratch_amax, cudaStream_t stream);
void launch_dequantize_matrix(const DeviceQuantizedMatrix& q, std::size_t rows, std::size_t cols,
                              formats::StorageFormat format, float* d_out, cudaStream_t stream);

}  // namespace replayssm::cuda
