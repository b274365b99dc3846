// Storing a dv x dk state in a StateFormat (quantize, then keep the dequantized float32 values:
// what a kernel reads back), and the stochastic-rounding stream of every quantization event.
//
// ---- Stochastic-rounding streams ------------------------------------------------------------
// Every quantization event of every stored state copy draws from its own Philox stream; the key
// is (seed = PrecisionPolicy::seed, stream), the counter the element's flat index row*dk + col
// (formats/quantized_matrix.h). The 64-bit stream id is built from disjoint bit fields:
//
//   bits 63..48  layer                      (16 bits, < 65536)
//   bits 47..36  key head                   (12 bits, < 4096)
//   bits 35..28  value head within the key head's group, g in [0, G)   (8 bits, G <= 256)
//   bit  27      copy: 0 = the copy that carries the recurrence (conventional state, shared
//                checkpoint, split HP checkpoint); 1 = the split LP read copy
//   bits 26..0   event: the 0-based index of this quantization event of this head group
//                (conventional: the decode step, t - 1 for token t; shared/split: the flush
//                index, one per checkpoint write; split writes HP and LP at the same event)
//
//   stream = (layer << 48) | (key_head << 36) | (value_head << 28) | (copy << 27) | event
// Reruns therefore draw the same bits, value heads and layers draw independent ones, and the
// literal decoders (replay_decode.h, conventional_decode.h) and the sequence emulator number
// their events identically, so their quantized states are bit-identical. A field out of range
// throws std::out_of_range instead of silently aliasing another stream.
#pragma once
#include <cstdint>

#include <Eigen/Core>

#include "formats/quantized_matrix.h"
#include "ssm/precision_policy.h"
#include "ssm/sequence_emulator.h"
#include "ssm/sr_stream.h"
#include "ssm/ssm_types.h"

namespace replayssm::ssm {

// Row-major so that quantization blocks run along dk, the contiguous dimension.
using StateMatrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

// The stream id of these fields (pack_sr_stream, ssm/sr_stream.h, after range checks).
uint64_t sr_stream(HeadGroupId id, int value_head, CheckpointCopy copy, uint64_t event);

// Throws std::invalid_argument when a dv x dk state cannot be stored in `f` (block formats need
// dk to be a multiple of the block size: 16 for nvfp4, 128 for fp8b128, 2 for e2m1).
void check_state_format(const StateFormat& f, int dv, int dk);

// S <- dequantize(quantize(S)) in place, bit-identical to formats::fake_quantize_matrix(S.data(),
// dv, dk, f.format, f.rounding, key) (tests/ssm/test_state_quantizer.cpp), but fused and without
// allocating, since the emulator quantizes once per token under conventional policies.
// Rounding rtn or sr; ef throws std::invalid_argument (it needs the residual: the overload below).
void quantize_state(StateMatrix& S, const StateFormat& f, formats::SrKey key);

// Error feedback's residual of one stored copy (formats::fake_quantize_with_error_feedback): a
// dv x dk zero matrix when `f` rounds by ef, else empty (0 x 0, nothing is carried).
StateMatrix error_feedback_residual(const StateFormat& f, int dv, int dk);

// The checkpoint copy `copy` of value head `value_head` at quantization event `event`, stored in
// `f`. `residual` (from error_feedback_residual) is that copy's error-feedback residual: read and
// updated under ef, untouched otherwise. Bit-identical to fake_quantize_with_error_feedback.
void quantize_state(StateMatrix& S, const StateFormat& f, uint64_t seed, HeadGroupId id, int value_head,
                    CheckpointCopy copy, uint64_t event, StateMatrix& residual);

// Same, for rtn and sr only (ef throws std::invalid_argument: no residual is given).
inline void quantize_state(StateMatrix& S, const StateFormat& f, uint64_t seed, HeadGroupId id, int value_head,
                           CheckpointCopy copy, uint64_t event) {
  if (f.format == formats::StorageFormat::fp32) return;
  quantize_state(S, f, formats::SrKey{seed, sr_stream(id, value_head, copy, event)});
}

}  // namespace replayssm::ssm
