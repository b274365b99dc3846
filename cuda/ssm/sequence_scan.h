// Teacher-forced scan kernels (issue 10): every head of one SSM layer through every token in one
// launch, under a PrecisionPolicy's semantics, the twin of ssm::emulate_layer_sequence
// (src/ssm/sequence_emulator.h), bit-identical to it: same FP32 operations in the same order
// (ssm/canonical_dot.h), the same quantizers (src/formats) and Philox streams (state_quantizer.h).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "ssm/precision_policy.h"
#include "ssm/sequence_emulator.h"

namespace replayssm::cuda {

// `seq` holds device pointers (layout: ssm::LayerSequence). Checkpoints are not returned unless
// `checkpoints` is given: then, for tests, every quantization event's stored state(s) are written
// there (layout: see the definition). Throws std::invalid_argument as the CPU twin does.
struct ScanCheckpoints;
void emulate_layer_sequence_gpu(const ssm::LayerSequence& seq, const ssm::PrecisionPolicy& policy, uint32_t layer,
                                cudaStream_t stream, ScanCheckpoints* checkpoints = nullptr);

}  // namespace replayssm::cuda
