#include "ssm/state_quantizer.h"

#include <stdexcept>

#include <fmt/format.h>

#include "formats/block_scaled.h"
#include "formats/philox.h"

namespace replayssm::ssm {

using formats::BlockAmax;
using formats::ElementFormat;
using formats::StorageFormat;

uint64_t sr_stream(HeadGroupId id, int value_head, CheckpointCopy copy, uint64_t event) {
  if (id.layer >= (1u << kStreamLayerBits))
    throw std::out_of_range(fmt::format("SR stream: layer {} does not fit {} bits", id.layer, kStreamLayerBits));
  if (id.key_head >= (1u << kStreamKeyHeadBits))
    throw std::out_of_range(
        fmt::format("SR stream: key head {} does not fit {} bits", id.key_head, kStreamKeyHeadBits));
  if (value_head < 0 || value_head >= (1 << kStreamValueHeadBits))
    throw std::out_of_range(fmt::format("SR stream: value head {} within the group does not fit {} bits", value_head,
                                        kStreamValueHeadBits));
  if (event >= kMaxStreamEvents)
    throw std::out_of_range(
        fmt::format("SR stream: quantization event {} does not fit {} bits", event, kStreamEventBits));
  return pack_sr_stream(id.layer, id.key_head, static_cast<uint32_t>(value_head), static_cast<uint32_t>(copy), event);
}

void check_state_format(const StateFormat& f, int dv, int dk) {
  if (dv < 1 || dk < 1) throw std::invalid_argument(fmt::format("state shape {}x{} must be positive", dv, dk));
  const int bs = formats::block_size(f.format);
  if (dk % bs != 0)
    throw std::invalid_argument(fmt::format(
        "a {}x{} state (dv x dk) cannot be stored in {}: its blocks of {} elements run along dk, so dk must be a "
        "multiple of {}",
        dv, dk, formats::to_string(f.format), bs, bs));
}

namespace {

ElementFormat element_of(StorageFormat f) {
  switch (f) {
    case StorageFormat::fp16: return ElementFormat::fp16;
    case StorageFormat::bf16: return ElementFormat::bf16;
    case StorageFormat::e4m3:
    case StorageFormat::fp8b128: return ElementFormat::e4m3;
    default: return ElementFormat::e2m1;
  }
}

}  // namespace

void quantize_state(StateMatrix& S, const StateFormat& f, formats::SrKey key) {
  if (f.format == StorageFormat::fp32) return;
  check_state_format(f, static_cast<int>(S.rows()), static_cast<int>(S.cols()));
  float* x = S.data();
  const std::size_t n = static_cast<std::size_t>(S.size());
  const formats::RoundingMode mode = formats::element_rounding_mode(f.rounding);
  const bool sr = mode == formats::RoundingMode::stochastic;
  auto word = [&](std::size_t i) { return sr ? formats::sr_random_word(key.seed, key.stream, i) : 0u; };
  const float nan = formats::bits_float(formats::kFloatQuietNanBits);

  switch (f.format) {
    case StorageFormat::fp32: return;
    case StorageFormat::fp16:
    case StorageFormat::bf16:
    case StorageFormat::e4m3:
    case StorageFormat::e2m1: {
      const ElementFormat ef = element_of(f.format);
      for (std::size_t i = 0; i < n; ++i) x[i] = formats::round_to_element(ef, x[i], mode, word(i));
      return;
    }
    case StorageFormat::fp8b128: {
      for (std::size_t begin = 0; begin < n; begin += formats::kFp8BlockSize) {
        BlockAmax amax;
        for (int j = 0; j < formats::kFp8BlockSize; ++j) formats::accumulate_amax(amax, x[begin + j]);
        if (amax.has_nonfinite) {  // poisoned block: NaN scale, every element decodes to NaN
          for (int j = 0; j < formats::kFp8BlockSize; ++j) x[begin + j] = nan;
          continue;
        }
        const float s = formats::fp8b128_block_scale(amax);
        const float inv = formats::fp8b128_element_encode_scale(s);
        for (int j = 0; j < formats::kFp8BlockSize; ++j) {
          const std::size_t i = begin + j;
          x[i] = formats::fp8b128_decode_element(
              formats::encode_element(ElementFormat::e4m3, x[i] * inv, mode, word(i)), s);
        }
      }
      return;
    }
    case StorageFormat::nvfp4: {
      BlockAmax global;
      for (std::size_t i = 0; i < n; ++i) formats::accumulate_amax(global, x[i]);
      const formats::Nvfp4TensorScale ts = formats::nvfp4_tensor_scale(global.amax);
      for (std::size_t begin = 0; begin < n; begin += formats::kNvfp4BlockSize) {
        BlockAmax amax;
        for (int j = 0; j < formats::kNvfp4BlockSize; ++j) formats::accumulate_amax(amax, x[begin + j]);
        if (amax.has_nonfinite) {
          for (int j = 0; j < formats::kNvfp4BlockSize; ++j) x[begin + j] = nan;
          continue;
        }
        const uint32_t scale_code = formats::nvfp4_block_scale_code(amax.amax, ts);
        const float enc = formats::nvfp4_element_encode_scale(scale_code, ts);
        for (int j = 0; j < formats::kNvfp4BlockSize; ++j) {
          const std::size_t i = begin + j;
          x[i] = formats::nvfp4_decode_element(
              formats::encode_element(ElementFormat::e2m1, x[i] * enc, mode, word(i)), scale_code, ts.decode);
        }
      }
      return;
    }
  }
}

StateMatrix error_feedback_residual(const StateFormat& f, int dv, int dk) {
  if (f.rounding != formats::Rounding::ef) return StateMatrix();
  return StateMatrix::Zero(dv, dk);
}

void quantize_state(StateMatrix& S, const StateFormat& f, uint64_t seed, HeadGroupId id, int value_head,
                    CheckpointCopy copy, uint64_t event, StateMatrix& residual) {
  if (f.format == StorageFormat::fp32) return;
  if (f.rounding != formats::Rounding::ef) {
    quantize_state(S, f, formats::SrKey{seed, sr_stream(id, value_head, copy, event)});
    return;
  }
  if (residual.rows() != S.rows() || residual.cols() != S.cols())
    throw std::logic_error(fmt::format("quantize_state: error-feedback residual is {}x{}, the state {}x{}",
                                       residual.rows(), residual.cols(), S.rows(), S.cols()));
  // y = S + E; S <- Q_rtn(y); E <- y - S (formats::fake_quantize_with_error_feedback, fused).
  residual.array() += S.array();
  S = residual;
  quantize_state(S, StateFormat{f.format, formats::Rounding::rtn}, formats::SrKey{});
  residual.array() -= S.array();
}

}  // namespace replayssm::ssm
