// The KL sweep's CUDA engine (eval::SweepEngine, src/eval/sweep_engine.h): the model's weights on
// one GPU (model/gpu_causal_lm.h), the reference's final hidden states kept there for the whole
// book, both distributions' logits made chunk by chunk by the LM head on the GPU and compared
// there (eval/kl_positions.h); only per-position results come back to the host.
#pragma once
#include <iosfwd>
#include <memory>
#include <string>

#include "eval/sweep_engine.h"
#include "model/gpu_block.h"

namespace replayssm::cuda {

// "" when a CUDA device can be used, else why not (no device, driver error).
std::string cuda_unavailable_reason();
// "" when `model` can run on the GPU, else why not (no GPU twin of a layer yet; not a checkpoint).
std::string cuda_engine_unsupported_reason(const model::TeacherForcedModel& model);

// A multi-process sweep's rank on a node with several GPUs (docs/MPI_SWEEP.md): makes GPU
// local_rank % device_count the current device (before make_cuda_engine) and says which, e.g.
// "GPU 3 of 8 (local rank 11 % 8)". Throws std::runtime_error without a device.
std::string bind_device_for_local_rank(int local_rank);

// Uploads the model to the current device (cudaSetDevice before to pick another). The memory plan
// of a book length (logit chunks of chunk_rows positions) is printed to `log` when first met, and
// a book that does not fit is refused with the plan (std::runtime_error) before anything is
// allocated for it. The model must outlive the engine.
std::unique_ptr<eval::SweepEngine> make_cuda_engine(model::TeacherForcedModel& model, GemmPrecision compute,
                                                    int chunk_rows, std::ostream& log);

std::string to_string(GemmPrecision p);  // "fp32", "bf16x3", "bf16"

}  // namespace replayssm::cuda
