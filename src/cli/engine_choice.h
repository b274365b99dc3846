// --device and --compute of the commands that run a model (kl-sweep, logits): which engine
// (eval/sweep_engine.h) computes the numbers. cpu: the reference path; cuda: the GPU engine
// (cuda/eval/cuda_sweep_engine.h); auto: cuda when this build has CUDA, a device is present and
// every layer of the model has a GPU twin, else cpu, saying why.
#pragma once
#include <iosfwd>
#include <memory>
#include <span>
#include <string>

#include "eval/sweep_engine.h"
#include "ssm/precision_policy.h"

#if REPLAYSSM_WITH_CUDA
#include "model/gpu_block.h"
#endif

namespace replayssm::model {
class CausalLM;
}

namespace replayssm::cli {

struct EngineChoice {
  std::string device = "auto";  // cpu | cuda | auto
  std::string compute = "fp32";  // fp32 | bf16x3 | bf16 (GPU only)
};
inline constexpr const char* kDeviceHelp =
    "cpu | cuda | auto (default auto: cuda when a GPU is present and the model's layers all run there)";
inline constexpr const char* kComputeHelp =
    "precision of the non-recurrent layers' matrix products: fp32 (default, the reference semantics) | bf16x3 "
    "(three BF16 tensor-core products, FP32-accurate) | bf16 (as serving engines run; GPU only)";

// true: run on the GPU. Refuses (std::invalid_argument) what cannot be honoured, see make_engine;
// says the device on `log` when it is the CPU. `lm` null: no checkpoint (CPU only). `policies`:
// every precision policy the run will use (the reference too); one the GPU cannot run keeps auto
// on the CPU and makes cuda refuse.
bool choose_cuda(const model::CausalLM* lm, const EngineChoice& choice, std::ostream& log, const std::string& command,
                 std::span<const ssm::PrecisionPolicy> policies = {});
#if REPLAYSSM_WITH_CUDA
cuda::GemmPrecision gemm_precision(const EngineChoice& choice);
#endif

// The engine for `model`, or std::invalid_argument (CLI exit 2) when the choice cannot be honoured:
// cuda asked for without a CUDA build or device, for a model with layers not on the GPU yet or for
// a policy the GPU cannot run, a compute precision other than fp32 on the CPU. The chosen device is said on `log` as
// "COMMAND: device: ...".
std::unique_ptr<eval::SweepEngine> make_engine(model::TeacherForcedModel& model, const EngineChoice& choice,
                                               int threads, int chunk_rows, std::ostream& log,
                                               const std::string& command,
                                               std::span<const ssm::PrecisionPolicy> policies = {});

}  // namespace replayssm::cli
