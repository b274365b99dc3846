// Teacher-forced scan kernels (issue 10): every head of one SSM layer through every token in one
// launch, under a PrecisionPolicy's semantics, the twin of ssm::emulate_layer_sequence
// (src/ssm/sequence_emulator.h), bit-identical to it: same FP32 operations in the same order
// (ssm/canonical_dot.h), the same quantizers (src/formats) and Philox streams (state_quantizer.h).
//
// The kernel runs the emulator's sequential fold, one token after the other. The chunked form
// (a window's tokens as small matrix products, the T x T triangular solve of the delta rule) is a
// different evaluation order of the same algebra: it would round differently, so its
// checkpoints and outputs could not equal the emulator's bit for bit, which is the contract here.
//
// Error feedback keeps each ef copy's residual in a device buffer of the head's state size
// (allocated stream-ordered for the launch), read and written only at that copy's quantization
// events. Skipping keeps the window's zero-started running state W in registers beside the others.
//
// Limits (std::invalid_argument beyond them): dk <= 256, dv <= 256; the checks of
// ssm::check_layer_sequence otherwise (the same exceptions as the CPU twin).
#pragma once
#include <string>
#include <cuda_runtime.h>

#include <cstdint>

#include "ssm/precision_policy.h"
#include "ssm/sequence_emulator.h"

namespace replayssm::cuda {

inline constexpr int kScanMaxDk = 256, kScanMaxDv = 256;

// Optional output for tests: the stored state(s) after every quantization event of every value
// head, as the emulator's on_checkpoint sees them (dequantized float32, row-major dv x dk).
// Layout of each buffer: [value head h][event e][dv][dk], element (h, e, r, c) at
//   ((h * events + e) * dv + r) * dk + c        (64-bit index)
// with events = ssm::quantization_events(policy, n_tokens); event e happened at token e
// (conventional) or (e + 1) L - 1 (shared, split).
// skip_counts (optional, policies with ',skip='): device, n_value_heads x 4 int64, per value head
// the emulator's SkipCounts in field order (steps, steps_skipped, flushes, flushes_skipped).
struct ScanCheckpoints {
  float* recur = nullptr;   // device, n_value_heads * events * dv * dk floats: the recur copy
  float* read = nullptr;    // split policies: the read copy, same layout; must be null otherwise
  int64_t events = 0;       // events per head the buffers hold; must equal quantization_events
  int64_t* skip_counts = nullptr;
};

// Why the scan kernels cannot run `policy` (empty when they can). Every policy the grammar
// accepts runs today, error feedback (+ef) and appendix F skipping (,skip=) included; the sweep
// engine still asks before any work, so a policy added to the grammar without a GPU scan makes
// --device auto fall back to the CPU and --device cuda refuse, instead of running something else.
std::string scan_unsupported_reason(const ssm::PrecisionPolicy& policy);

// `seq` holds device pointers (layout: ssm::LayerSequence). Asynchronous on `stream`. Checkpoints are written only when `checkpoints`
// is given. Throws std::invalid_argument / std::out_of_range as the CPU twin does, and
// std::invalid_argument beyond the limits above or for inconsistent checkpoint buffers.
void emulate_layer_sequence_gpu(const ssm::LayerSequence& seq, const ssm::PrecisionPolicy& policy, uint32_t layer,
                                cudaStream_t stream, ScanCheckpoints* checkpoints = nullptr);

}  // namespace replayssm::cuda
