#include "cli/engine_choice.h"

#include <ostream>
#include <stdexcept>

#include <fmt/format.h>

#include "model/causal_lm.h"

#if REPLAYSSM_WITH_CUDA
#include "eval/cuda_sweep_engine.h"
#include "model/gpu_causal_lm.h"
#include "ssm/sequence_scan.h"
#endif

namespace replayssm::cli {

bool choose_cuda(const model::CausalLM* lm, const EngineChoice& c, std::ostream& log, const std::string& command,
                 std::span<const ssm::PrecisionPolicy> policies) {
  if (c.device != "cpu" && c.device != "cuda" && c.device != "auto")
    throw std::invalid_argument(fmt::format("--device: '{}' is not a device: expected cpu, cuda or auto", c.device));
  if (c.compute != "fp32" && c.compute != "bf16x3" && c.compute != "bf16")
    throw std::invalid_argument(
        fmt::format("--compute: '{}' is not a compute precision: expected fp32, bf16x3 or bf16", c.compute));
  std::string why_not_cuda;
#if REPLAYSSM_WITH_CUDA
  if (c.device != "cpu") {
    why_not_cuda = cuda::cuda_unavailable_reason();
    if (why_not_cuda.empty())
      why_not_cuda = lm ? cuda::GpuCausalLM::unsupported_reason(*lm)
                        : "the model is not a loaded checkpoint (the CUDA engine uploads a CausalLM's weights)";
    for (const ssm::PrecisionPolicy& p : policies)
      if (why_not_cuda.empty()) why_not_cuda = cuda::scan_unsupported_reason(p);
  }
#else
  (void)lm;
  (void)policies;
  why_not_cuda = "this build has no CUDA support (configure with -DREPLAYSSM_CUDA=ON where nvcc is installed)";
#endif
  const bool use_cuda = c.device != "cpu" && why_not_cuda.empty();
  if (c.device == "cuda" && !use_cuda) throw std::invalid_argument("--device cuda: " + why_not_cuda + "; use --device cpu");
  if (!use_cuda && c.compute != "fp32")
    throw std::invalid_argument(fmt::format("--compute {}: the CPU computes in FP32 only; {}", c.compute,
                                            c.device == "cpu" ? "use --device cuda" : "--device auto chose the CPU: " +
                                                                                          why_not_cuda));
  if (!use_cuda) log << fmt::format("{}: device: cpu{}\n", command, c.device == "auto" ? " (auto: " + why_not_cuda + ")" : "");
  return use_cuda;
}

#if REPLAYSSM_WITH_CUDA
cuda::GemmPrecision gemm_precision(const EngineChoice& c) {
  if (c.compute == "bf16") return cuda::GemmPrecision::bf16;
  if (c.compute == "bf16x3") return cuda::GemmPrecision::bf16x3;
  return cuda::GemmPrecision::fp32;
}
#endif

std::unique_ptr<eval::SweepEngine> make_engine(model::TeacherForcedModel& model, const EngineChoice& c, int threads,
                                               int chunk_rows, std::ostream& log, const std::string& command,
                                               std::span<const ssm::PrecisionPolicy> policies) {
  if (!choose_cuda(model.causal_lm(), c, log, command, policies)) return eval::make_cpu_engine(model, threads);
#if REPLAYSSM_WITH_CUDA
  auto engine = cuda::make_cuda_engine(model, gemm_precision(c), chunk_rows, log);
  log << fmt::format("{}: device: {}\n", command, engine->device());
  return engine;
#else
  (void)chunk_rows;
  throw std::logic_error("choose_cuda chose CUDA in a build without it");
#endif
}

}  // namespace replayssm::cli
