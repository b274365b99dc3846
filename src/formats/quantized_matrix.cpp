#include "formats/quantized_matrix.h"

#include <stdexcept>

#include <fmt/format.h>

#include "formats/philox.h"

namespace replayssm::formats {

std::string_view to_string(StorageFormat f) {
  switch (f) {
    case StorageFormat::fp32: return "fp32";
    case StorageFormat::fp16: return "fp16";
    case StorageFormat::bf16: return "bf16";
    case StorageFormat::e4m3: return "e4m3";
    case StorageFormat::e2m1: return "e2m1";
    case StorageFormat::fp8b128: return "fp8b128";
    case StorageFormat::nvfp4: return "nvfp4";
  }
  return "?";
}

std::string_view to_string(Rounding r) {
  switch (r) {
    case Rounding::rtn: return "rtn";
    case Rounding::sr: return "sr";
    case Rounding::ef: return "ef";
  }
  return "?";
}

StorageFormat parse_storage_format(std::string_view text) {
  for (StorageFormat f : kAllStorageFormats)
    if (text == to_string(f)) return f;
  if (text == "fp8") return StorageFormat::fp8b128;  // the paper's name for its FP8 state format
  throw std::invalid_argument(fmt::format(
      "unknown number format '{}': expected one of fp32, fp16, bf16, e4m3, e2m1, fp8b128 (alias fp8), nvfp4", text));
}

Rounding parse_rounding(std::string_view text) {
  if (text == "rtn" || text == "rn") return Rounding::rtn;
  if (text == "sr") return Rounding::sr;
  if (text == "ef") return Rounding::ef;
  throw std::invalid_argument(
      fmt::format("unknown rounding '{}': expected rtn, sr or ef (error feedback)", text));
}

int block_size(StorageFormat f) {
  if (f == StorageFormat::nvfp4) return kNvfp4BlockSize;
  if (f == StorageFormat::fp8b128) return kFp8BlockSize;
  if (f == StorageFormat::e2m1) return 2;  // two codes per byte
  return 1;
}

int element_bits(StorageFormat f) {
  switch (f) {
    case StorageFormat::fp32: return 32;
    case StorageFormat::fp16:
    case StorageFormat::bf16: return 16;
    case StorageFormat::e4m3:
    case StorageFormat::fp8b128: return 8;
    case StorageFormat::e2m1:
    case StorageFormat::nvfp4: return 4;
  }
  return 32;
}

float unit_roundoff(StorageFormat f) {
  switch (f) {
    case StorageFormat::fp32: return 0x1p-24f;
    case StorageFormat::fp16: return 0x1p-11f;
    case StorageFormat::bf16: return 0x1p-8f;
    case StorageFormat::e4m3:
    case StorageFormat::fp8b128: return 0x1p-4f;
    case StorageFormat::e2m1:
    case StorageFormat::nvfp4: return 0x1p-2f;
  }
  return 0x1p-24f;
}

std::size_t storage_bytes(StorageFormat f, std::size_t rows, std::size_t cols) {
  const std::size_t n = rows * cols;
  const std::size_t codes = n * element_bits(f) / 8;
  if (f == StorageFormat::nvfp4) return codes + n / kNvfp4BlockSize + sizeof(float);
  if (f == StorageFormat::fp8b128) return codes + n / kFp8BlockSize * sizeof(float);
  return codes;
}

RoundingMode element_rounding_mode(Rounding r) {
  if (r == Rounding::ef)
    throw std::invalid_argument(
        "rounding 'ef' (error feedback) carries a residual from one quantization of a stored copy to the next: it "
        "is not an element rounding, and this operation supports rtn and sr only");
  return r == Rounding::sr ? RoundingMode::stochastic : RoundingMode::nearest_even;
}

namespace {

ElementFormat element_format_of(StorageFormat f) {
  switch (f) {
    case StorageFormat::fp16: return ElementFormat::fp16;
    case StorageFormat::bf16: return ElementFormat::bf16;
    case StorageFormat::e4m3:
    case StorageFormat::fp8b128: return ElementFormat::e4m3;
    default: return ElementFormat::e2m1;
  }
}

void set_nibble(std::vector<uint8_t>& bytes, std::size_t i, uint32_t code) {
  uint8_t& b = bytes[i / 2];
  b = (i % 2 == 0) ? static_cast<uint8_t>((b & 0xF0u) | (code & 0xFu))
                   : static_cast<uint8_t>((b & 0x0Fu) | ((code & 0xFu) << 4));
}

uint32_t get_nibble(const std::vector<uint8_t>& bytes, std::size_t i) {
  return (i % 2 == 0) ? (bytes[i / 2] & 0xFu) : (bytes[i / 2] >> 4);
}

}  // namespace

uint32_t QuantizedMatrix::element_code(std::size_t i) const {
  switch (format) {
    case StorageFormat::fp32:
      return static_cast<uint32_t>(payload[4 * i]) | (static_cast<uint32_t>(payload[4 * i + 1]) << 8) |
             (static_cast<uint32_t>(payload[4 * i + 2]) << 16) | (static_cast<uint32_t>(payload[4 * i + 3]) << 24);
    case StorageFormat::fp16:
    case StorageFormat::bf16: return static_cast<uint32_t>(payload[2 * i]) | (static_cast<uint32_t>(payload[2 * i + 1]) << 8);
    case StorageFormat::e4m3:
    case StorageFormat::fp8b128: return payload[i];
    case StorageFormat::e2m1:
    case StorageFormat::nvfp4: return get_nibble(payload, i);
  }
  return 0;
}

void check_block_shape(StorageFormat format, std::size_t rows, std::size_t cols) {
  const int bs = block_size(format);
  if (cols % static_cast<std::size_t>(bs) != 0)
    throw std::invalid_argument(fmt::format(
        "{} stores blocks of {} consecutive elements along the last dimension, but it has {} elements "
        "(shape {}x{}); expected a multiple of {}",
        to_string(format), bs, cols, rows, cols, bs));
}

QuantizedMatrix allocate_quantized_matrix(StorageFormat format, std::size_t rows, std::size_t cols) {
  check_block_shape(format, rows, cols);
  QuantizedMatrix q;
  q.format = format;
  q.rows = rows;
  q.cols = cols;
  const std::size_t n = rows * cols;
  q.payload.assign(n * static_cast<std::size_t>(element_bits(format)) / 8, 0);
  if (format == StorageFormat::nvfp4) q.block_scale_codes.assign(n / kNvfp4BlockSize, 0);
  if (format == StorageFormat::fp8b128) q.block_scales.assign(n / kFp8BlockSize, 0.0f);
  return q;
}

QuantizedMatrix quantize_matrix(const float* values, std::size_t rows, std::size_t cols, StorageFormat format,
                                Rounding rounding, SrKey key) {
  QuantizedMatrix q = allocate_quantized_matrix(format, rows, cols);
  const std::size_t n = rows * cols;
  const RoundingMode mode = element_rounding_mode(rounding);
  auto random_word = [&](std::size_t i) {
    return mode == RoundingMode::stochastic ? sr_random_word(key.seed, key.stream, i) : 0u;
  };
  switch (format) {
    case StorageFormat::fp32:
      for (std::size_t i = 0; i < n; ++i) {
        const uint32_t b = float_bits(values[i]);
        for (int k = 0; k < 4; ++k) q.payload[4 * i + k] = static_cast<uint8_t>(b >> (8 * k));
      }
      break;
    case StorageFormat::fp16:
    case StorageFormat::bf16: {
      const ElementFormat ef = element_format_of(format);
      for (std::size_t i = 0; i < n; ++i) {
        const uint32_t c = encode_element(ef, values[i], mode, random_word(i));
        q.payload[2 * i] = static_cast<uint8_t>(c);
        q.payload[2 * i + 1] = static_cast<uint8_t>(c >> 8);
      }
      break;
    }
    case StorageFormat::e4m3:
      for (std::size_t i = 0; i < n; ++i)
        q.payload[i] = static_cast<uint8_t>(encode_element(ElementFormat::e4m3, values[i], mode, random_word(i)));
      break;
    case StorageFormat::e2m1:
      for (std::size_t i = 0; i < n; ++i)
        set_nibble(q.payload, i, encode_element(ElementFormat::e2m1, values[i], mode, random_word(i)));
      break;
    case StorageFormat::fp8b128: {
      for (std::size_t b = 0; b < q.block_scales.size(); ++b) {
        const std::size_t begin = b * kFp8BlockSize;
        BlockAmax amax;
        for (int j = 0; j < kFp8BlockSize; ++j) accumulate_amax(amax, values[begin + j]);
        const float s = fp8b128_block_scale(amax);
        q.block_scales[b] = s;
        const float inv = fp8b128_element_encode_scale(s);
        for (int j = 0; j < kFp8BlockSize; ++j) {
          const std::size_t i = begin + j;
          q.payload[i] = amax.has_nonfinite
                             ? static_cast<uint8_t>(kE4m3NanCode)
                             : static_cast<uint8_t>(encode_element(ElementFormat::e4m3, values[i] * inv, mode, random_word(i)));
        }
      }
      break;
    }
    case StorageFormat::nvfp4: {
      BlockAmax global;
      for (std::size_t i = 0; i < n; ++i) accumulate_amax(global, values[i]);
      const Nvfp4TensorScale ts = nvfp4_tensor_scale(global.amax);
      q.tensor_scale = ts.decode;
      for (std::size_t b = 0; b < q.block_scale_codes.size(); ++b) {
        const std::size_t begin = b * kNvfp4BlockSize;
        BlockAmax amax;
        for (int j = 0; j < kNvfp4BlockSize; ++j) accumulate_amax(amax, values[begin + j]);
        if (amax.has_nonfinite) {
          q.block_scale_codes[b] = static_cast<uint8_t>(kE4m3NanCode);
          continue;  // element codes stay 0
        }
        const uint32_t scale_code = nvfp4_block_scale_code(amax.amax, ts);
        q.block_scale_codes[b] = static_cast<uint8_t>(scale_code);
        const float enc = nvfp4_element_encode_scale(scale_code, ts);
        for (int j = 0; j < kNvfp4BlockSize; ++j) {
          const std::size_t i = begin + j;
          set_nibble(q.payload, i, encode_element(ElementFormat::e2m1, values[i] * enc, mode, random_word(i)));
        }
      }
      break;
    }
  }
  return q;
}

void dequantize_matrix(const QuantizedMatrix& q, float* out) {
  const std::size_t n = q.size();
  switch (q.format) {
    case StorageFormat::fp32:
      for (std::size_t i = 0; i < n; ++i) out[i] = bits_float(q.element_code(i));
      break;
    case StorageFormat::fp16:
    case StorageFormat::bf16:
    case StorageFormat::e4m3:
    case StorageFormat::e2m1: {
      const ElementFormat ef = element_format_of(q.format);
      for (std::size_t i = 0; i < n; ++i) out[i] = decode_element(ef, q.element_code(i));
      break;
    }
    case StorageFormat::fp8b128:
      for (std::size_t i = 0; i < n; ++i) out[i] = fp8b128_decode_element(q.payload[i], q.block_scales[i / kFp8BlockSize]);
      break;
    case StorageFormat::nvfp4:
      for (std::size_t i = 0; i < n; ++i)
        out[i] = nvfp4_decode_element(get_nibble(q.payload, i), q.block_scale_codes[i / kNvfp4BlockSize], q.tensor_scale);
      break;
  }
}

void fake_quantize_matrix(float* values, std::size_t rows, std::size_t cols, StorageFormat format, Rounding rounding,
                          SrKey key) {
  if (format == StorageFormat::fp32) return;
  const QuantizedMatrix q = quantize_matrix(values, rows, cols, format, rounding, key);
  dequantize_matrix(q, values);
}

void fake_quantize_with_error_feedback(float* values, float* residual, std::size_t rows, std::size_t cols,
                                       StorageFormat format) {
  if (format == StorageFormat::fp32) return;
  check_block_shape(format, rows, cols);
  const std::size_t n = rows * cols;
  for (std::size_t i = 0; i < n; ++i) residual[i] = values[i] += residual[i];  // y
  fake_quantize_matrix(values, rows, cols, format, Rounding::rtn);
  for (std::size_t i = 0; i < n; ++i) residual[i] -= values[i];  // y - Q(y)
}

}  // namespace replayssm::formats
