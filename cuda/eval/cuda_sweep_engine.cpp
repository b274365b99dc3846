#include "eval/cuda_sweep_engine.h"

#include <chrono>
#include <ostream>
#include <stdexcept>
#include <vector>

#include <fmt/format.h>

#include "cuda_check.h"
#include "device_memory.h"
#include "eval/kl_positions.h"
#include "model/causal_lm.h"
#include "model/gpu_causal_lm.h"

namespace replayssm::cuda {

std::string to_string(GemmPrecision p) {
  switch (p) {
    case GemmPrecision::fp32: return "fp32";
    case GemmPrecision::bf16x3: return "bf16x3";
    case GemmPrecision::bf16: return "bf16";
  }
  return "?";
}

std::string cuda_unavailable_reason() {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    cudaGetLastError();  // clear the sticky error of a failed driver query
    return fmt::format("no usable CUDA device ({})", cudaGetErrorString(e));
  }
  if (count == 0) return "no CUDA device";
  return "";
}

std::string cuda_engine_unsupported_reason(const model::TeacherForcedModel& model) {
  const model::CausalLM* lm = model.causal_lm();
  if (lm == nullptr) return "the model is not a loaded checkpoint (the CUDA engine uploads a CausalLM's weights)";
  return GpuCausalLM::unsupported_reason(*lm);
}

namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::string gib(int64_t bytes) { return fmt::format("{:.2f} GiB", static_cast<double>(bytes) / (1024.0 * 1024 * 1024)); }

class CudaEngine final : public eval::SweepEngine {
 public:
  CudaEngine(model::TeacherForcedModel& model, GemmPrecision compute, int chunk_rows, std::ostream& log)
      : model_(model), log_(log), gpu_(*model.causal_lm(), compute), chunk_rows_(chunk_rows) {
    int dev = 0;
    REPLAYSSM_CUDA_CHECK(cudaGetDevice(&dev));
    cudaDeviceProp prop{};
    REPLAYSSM_CUDA_CHECK(cudaGetDeviceProperties(&prop, dev));
    device_ = fmt::format("cuda: {} (sm_{}{}), compute {}", prop.name, prop.major, prop.minor, to_string(compute));
    compute_ = compute == GemmPrecision::bf16 ? "bf16" : compute == GemmPrecision::bf16x3 ? "bf16x3" : "fp32";
  }
  const model::TeacherForcedModel& model() const override { return model_; }
  std::string device() const override { return device_; }
  std::string compute() const override { return compute_; }

  void set_reference(std::span<const int32_t> input, const ssm::PrecisionPolicy& policy) override {
    const auto N = static_cast<int64_t>(input.size());
    plan_memory(N);
    input_.assign(input.begin(), input.end());
    ref_hidden_.resize(N, gpu_.hidden_size());
    gpu_.final_hidden(input_, model::PolicyAssignment(policy), ref_hidden_.view());
    REPLAYSSM_CUDA_CHECK(cudaStreamSynchronize(gpu_.stream()));
  }

  eval::CompareTimes compare(const ssm::PrecisionPolicy& policy, std::span<const int32_t> targets, int chunk_rows,
                             const eval::CompareCallbacks& cb) override {
    const auto N = static_cast<int64_t>(input_.size());
    if (ref_hidden_.rows() != N || N == 0) throw std::logic_error("SweepEngine::compare before set_reference");
    if (static_cast<int64_t>(targets.size()) != N)
      throw std::invalid_argument(fmt::format("compare: {} targets for {} positions", targets.size(), N));
    const int vocab = gpu_.vocab_size();
    if (cb.on_phase) cb.on_phase("forward");
    const double t0 = now_s();
    cfg_hidden_.resize(N, gpu_.hidden_size());
    gpu_.final_hidden(input_, model::PolicyAssignment(policy), cfg_hidden_.view());
    REPLAYSSM_CUDA_CHECK(cudaStreamSynchronize(gpu_.stream()));
    const double t1 = now_s();
    if (cb.on_phase) cb.on_phase("KL");
    targets_.upload(targets.data(), targets.size(), gpu_.stream());
    const int64_t chunk = std::min<int64_t>(chunk_rows, N);
    logits_ref_.resize(chunk, vocab);
    logits_cfg_.resize(chunk, vocab);
    std::vector<eval::PositionResult> results;
    for (int64_t p0 = 0; p0 < N; p0 += chunk) {
      const int64_t rows = std::min<int64_t>(chunk, N - p0);
      const DeviceMatrix lr = logits_ref_.view().middle_rows(0, rows), lc = logits_cfg_.view().middle_rows(0, rows);
      gpu_.lm_logits(ref_hidden_.view().middle_rows(p0, rows), lr);
      gpu_.lm_logits(cfg_hidden_.view().middle_rows(p0, rows), lc);
      results.resize(static_cast<std::size_t>(rows));
      compare_positions_gpu(lr, lc, targets_.data() + p0, results, gpu_.stream());
      if (cb.on_results) cb.on_results(p0, results);
    }
    return {t1 - t0, now_s() - t1};
  }

 private:
  // The memory plan of a book of N positions: printed once per length, refused when it does not fit.
  void plan_memory(int64_t N) {
    if (N == planned_) return;
    const GpuMemoryPlan plan = gpu_.memory_plan(N);
    const int64_t hidden = 2 * N * gpu_.hidden_size() * 4;  // reference + configuration final hidden states
    const int64_t chunk = 2 * std::min<int64_t>(N, chunk_rows_) * gpu_.vocab_size() * 4;  // both logit chunks
    const int64_t total = plan.total() + hidden + chunk;
    std::size_t free_b = 0, total_b = 0;
    REPLAYSSM_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
    log_ << fmt::format(
        "kl-sweep: GPU memory plan for N = {}: weights {} (uploaded), activations {}, block scratch {}, scan "
        "states {}, final hidden states (reference + configuration) {}, logit chunks {}; total {} of {} free "
        "({} on the device)\n",
        N, gib(plan.weight_bytes), gib(plan.activation_bytes), gib(plan.scratch_bytes), gib(plan.state_bytes),
        gib(hidden), gib(chunk), gib(total), gib(static_cast<int64_t>(free_b) + plan.weight_bytes),
        gib(static_cast<int64_t>(total_b)));
    // The weights are already resident: compare what is still to be allocated with what is free.
    if (total - plan.weight_bytes > static_cast<int64_t>(free_b))
      throw std::runtime_error(fmt::format("kl-sweep: N = {} positions do not fit on the GPU: {} more needed, {} free "
                                           "(shorten --length, or --device cpu)",
                                           N, gib(total - plan.weight_bytes), gib(static_cast<int64_t>(free_b))));
    planned_ = N;
  }

  model::TeacherForcedModel& model_;
  std::ostream& log_;
  GpuCausalLM gpu_;
  int chunk_rows_;
  std::string device_, compute_;
  int64_t planned_ = -1;
  std::vector<int32_t> input_;
  DeviceMatrixBuffer ref_hidden_, cfg_hidden_, logits_ref_, logits_cfg_;
  DeviceBuffer<int32_t> targets_;
};

}  // namespace

std::unique_ptr<eval::SweepEngine> make_cuda_engine(model::TeacherForcedModel& model, GemmPrecision compute,
                                                    int chunk_rows, std::ostream& log) {
  if (const std::string why = cuda_unavailable_reason(); !why.empty()) throw std::runtime_error("--device cuda: " + why);
  if (const std::string why = cuda_engine_unsupported_reason(model); !why.empty())
    throw std::runtime_error("--device cuda: " + why);
  return std::make_unique<CudaEngine>(model, compute, chunk_rows, log);
}

}  // namespace replayssm::cuda
