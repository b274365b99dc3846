// Whole-matrix quantization API (host): a state matrix S (rows = dv, cols = dk, row-major,
// blocks along the contiguous dim) stored in one of the toolkit's formats.
//
// Storage layout (what a kernel reads; `storage_bytes()` is what the traffic model counts):
//   fp32          4 B/element, raw
//   fp16, bf16    2 B/element, little-endian codes
//   e4m3          1 B/element, no scale (plain cast, saturating)
//   e2m1          two codes per byte, element 2i in the low nibble, no scale
//   fp8b128       1 B/element E4M3 codes + one float32 scale per 128 elements
//   nvfp4         two E2M1 codes per byte + one E4M3 scale byte per 16 elements + one float32
//                 tensor scale (S_dec)
// Element flat index (row*cols + col) is the stochastic-rounding counter, so results do not
// depend on how the work is split.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "formats/block_scaled.h"

namespace replayssm::formats {

enum class StorageFormat : uint8_t { fp32, fp16, bf16, e4m3, e2m1, fp8b128, nvfp4 };
// rtn: round to nearest, ties to even. sr: stochastic rounding (Philox stream, FORMATS.md).
// ef: error feedback: RTN of the value plus the residual the previous quantization of the same
// stored copy dropped, the new residual carried to the next one (fake_quantize_with_error_feedback).
// It needs that residual, so it is not an element rounding mode: the whole-matrix functions below
// that take a Rounding refuse it.
enum class Rounding : uint8_t { rtn, sr, ef };

inline constexpr StorageFormat kAllStorageFormats[] = {StorageFormat::fp32, StorageFormat::fp16,
                                                       StorageFormat::bf16, StorageFormat::e4m3,
                                                       StorageFormat::e2m1, StorageFormat::fp8b128,
                                                       StorageFormat::nvfp4};

std::string_view to_string(StorageFormat f);
std::string_view to_string(Rounding r);
// Throws std::invalid_argument naming the accepted spellings.
StorageFormat parse_storage_format(std::string_view text);
Rounding parse_rounding(std::string_view text);

// Block size along the contiguous dimension (1 for unblocked formats).
int block_size(StorageFormat f);
// Bits per stored element, scales excluded.
int element_bits(StorageFormat f);
// Unit roundoff u = 2^-p (p significand bits, the implicit one included) of the element format:
// the largest relative error of one RTN rounding of a normal value. fp32 2^-24, fp16 2^-11, bf16
// 2^-8, e4m3 and fp8b128 2^-4, e2m1 and nvfp4 2^-2.
float unit_roundoff(StorageFormat f);
// Bytes of a rows x cols matrix in this format, scales included.
std::size_t storage_bytes(StorageFormat f, std::size_t rows, std::size_t cols);

// Key of the stochastic-rounding generator: (seed, stream); the element index completes it.
struct SrKey {
  uint64_t seed = 0;
  uint64_t stream = 0;
};

// The element rounding of rtn and sr. Throws std::invalid_argument for ef, which is not one (it
// carries a residual between quantizations): code that has not been taught error feedback refuses it.
RoundingMode element_rounding_mode(Rounding r);

struct QuantizedMatrix {
  StorageFormat format = StorageFormat::fp32;
  std::size_t rows = 0, cols = 0;
  std::vector<uint8_t> payload;            // element codes as laid out above
  std::vector<uint8_t> block_scale_codes;  // nvfp4: one E4M3 code per block
  std::vector<float> block_scales;         // fp8b128: one float32 per block
  float tensor_scale = 1.0f;               // nvfp4: S_dec
  std::size_t size() const { return rows * cols; }
  std::size_t storage_bytes() const { return formats::storage_bytes(format, rows, cols); }
  // Unpacked element code of element i (fp32: the float bits).
  uint32_t element_code(std::size_t i) const;
};

// Throws std::invalid_argument when cols is not a multiple of the block size.
void check_block_shape(StorageFormat format, std::size_t rows, std::size_t cols);
// A zero-filled container of the right sizes (what a GPU quantizer fills in).
QuantizedMatrix allocate_quantized_matrix(StorageFormat format, std::size_t rows, std::size_t cols);

QuantizedMatrix quantize_matrix(const float* values, std::size_t rows, std::size_t cols, StorageFormat format,
                                Rounding rounding, SrKey key = {});
void dequantize_matrix(const QuantizedMatrix& q, float* out);

// In-place quantize-then-dequantize (what the CPU reference stores in a low-precision state).
void fake_quantize_matrix(float* values, std::size_t rows, std::size_t cols, StorageFormat format, Rounding rounding,
                          SrKey key = {});

// Error feedback (Rounding::ef), in place: y = values + residual (float32), values <- Q_rtn(y),
// residual <- y - values. Block and tensor scales are those of y. A residual starts at zero; over
// repeated quantizations of one copy the running sum of what was stored tracks the running sum of
// what was meant to within one residual. Non-finite y gives a non-finite residual (a result, as
// an overflowed state is). fp32 is stored exactly and leaves the residual as it is.
void fake_quantize_with_error_feedback(float* values, float* residual, std::size_t rows, std::size_t cols,
                                       StorageFormat format);

}  // namespace replayssm::formats
