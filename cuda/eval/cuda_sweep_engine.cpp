#include "eval/cuda_sweep_engine.h"

#include <chrono>
#include <cstdlib>
#include <functional>
#include <optional>
#include <ostream>
#include <string_view>
#include <stdexcept>
#include <vector>

#include <fmt/format.h>

#include "cuda_check.h"
#include "device_memory.h"
#include "eval/kl_positions.h"
#include "model/causal_lm.h"
#include "model/gpu_causal_lm.h"
#include "model/gpu_timing.h"
#include "model/linear_gpu.h"

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

// REPLAYSSM_GPU_TIMING set and not "0": the time split of every pass is printed to the log.
bool timing_requested() {
  const char* v = std::getenv("REPLAYSSM_GPU_TIMING");
  return v != nullptr && *v != '\0' && std::string_view(v) != "0";
}

// H200 SXM datasheet peaks (dense), the scale the benchmark reports against (issue 10).
constexpr double kPeakFp32Flops = 67e12, kPeakBf16TensorFlops = 989e12;

std::string rate(double flops, double seconds) {
  if (seconds <= 0) return "-";
  return fmt::format("{:.1f} TFLOP/s", flops / seconds / 1e12);
}
std::string share(double flops, double seconds, double peak) {
  if (seconds <= 0) return "-";
  return fmt::format("{:.0f}%", 100.0 * flops / seconds / peak);
}

// The forward's split in one line (GpuForwardTiming): GEMMs, attention kernels, SSM blocks without
// their GEMMs (scan, conv, gates, norms), the rest (norms, residual adds, MLP activations, embedding).
std::string forward_split(const GpuForwardTiming& t, GemmPrecision compute) {
  const double attention = t.attention_layers - t.attention_gemm, ssm = t.ssm_layers - t.ssm_gemm;
  const double other = t.total - t.gemm() - attention - ssm;
  const std::string gemm_peak =
      compute == GemmPrecision::fp32
          ? fmt::format("{} of the FP32 peak", share(t.gemm_flops, t.gemm(), kPeakFp32Flops))
          : fmt::format("tensor cores {} = {} of the BF16 peak", rate(t.gemm_tensor_flops, t.gemm()),
                        share(t.gemm_tensor_flops, t.gemm(), kPeakBf16TensorFlops));
  return fmt::format(
      "forward {:.2f} s = GEMMs {:.2f} s ({} calls, {:.1f} TFLOP, {}, {}) + attention {:.2f} s ({:.1f} TFLOP, {}, {} "
      "of the FP32 peak) + SSM scans with their conv/gates/norms {:.2f} s + other {:.2f} s",
      t.total, t.gemm(), t.gemm_calls, t.gemm_flops / 1e12, rate(t.gemm_flops, t.gemm()), gemm_peak, attention,
      t.attention_flops / 1e12, rate(t.attention_flops, attention), share(t.attention_flops, attention, kPeakFp32Flops),
      ssm, other);
}

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
    compute_precision_ = compute;
    timing_ = timing_requested();
    gpu_.set_timing(timing_);
    if (timing_)
      log_ << fmt::format("kl-sweep: REPLAYSSM_GPU_TIMING: the GPU time split of every pass follows (CUDA events; "
                          "peaks: H200 SXM datasheet, FP32 {:.0f} TFLOP/s, BF16 tensor cores {:.0f} TFLOP/s dense)\n",
                          kPeakFp32Flops / 1e12, kPeakBf16TensorFlops / 1e12);
  }
  const model::TeacherForcedModel& model() const override { return model_; }
  std::string device() const override { return device_; }
  std::string compute() const override { return compute_; }

  void set_reference(std::span<const int32_t> input, const ssm::PrecisionPolicy& policy) override {
    const auto N = static_cast<int64_t>(input.size());
    plan_memory(N);
    input_.assign(input.begin(), input.end());
    reference_ = policy;
    ref_hidden_.resize(N, gpu_.hidden_size());
    const double t0 = now_s();
    gpu_.final_hidden(input_, model::PolicyAssignment(policy), ref_hidden_.view());
    REPLAYSSM_CUDA_CHECK(cudaStreamSynchronize(gpu_.stream()));
    if (timing_) {
      const double seconds = now_s() - t0;
      log_ << fmt::format("kl-sweep: GPU timing, reference {}: {} positions, forward {:.2f} s wall ({:.0f} tokens/s); {}\n",
                          policy.to_string(), N, seconds, static_cast<double>(N) / seconds,
                          forward_split(gpu_.last_timing(), compute_precision_));
    }
  }

  // The multi-process sweep's hand-over (eval::SweepEngine): the reference's final hidden states
  // go through the host, bit for bit (a D2H copy of the buffer set_reference filled; an upload).
  std::vector<float> reference_hidden() const override {
    if (ref_hidden_.rows() == 0) throw std::logic_error("SweepEngine::reference_hidden before set_reference");
    REPLAYSSM_CUDA_CHECK(cudaStreamSynchronize(gpu_.stream()));
    return to_host(ref_hidden_.view());
  }

  void set_reference_hidden(std::span<const int32_t> input, const ssm::PrecisionPolicy& policy,
                            std::span<const float> hidden) override {
    const auto N = static_cast<int64_t>(input.size());
    eval::check_reference_hidden_size(hidden.size(), N, gpu_.hidden_size());
    plan_memory(N);
    input_.assign(input.begin(), input.end());
    reference_ = policy;
    ref_hidden_.resize(N, gpu_.hidden_size());
    upload(hidden.data(), ref_hidden_.view(), gpu_.stream());
    // The host span may be freed once this returns.
    REPLAYSSM_CUDA_CHECK(cudaStreamSynchronize(gpu_.stream()));
  }

  eval::CompareTimes compare(const ssm::PrecisionPolicy& policy, std::span<const int32_t> targets, int chunk_rows,
                             const eval::CompareCallbacks& cb) override {
    const auto N = static_cast<int64_t>(input_.size());
    if (ref_hidden_.rows() != N || N == 0) throw std::logic_error("SweepEngine::compare before set_reference");
    if (static_cast<int64_t>(targets.size()) != N)
      throw std::invalid_argument(fmt::format("compare: {} targets for {} positions", targets.size(), N));
    if (cb.on_phase) cb.on_phase("forward");
    const double t0 = now_s();
    cfg_hidden_.resize(N, gpu_.hidden_size());
    gpu_.final_hidden(input_, model::PolicyAssignment(policy), cfg_hidden_.view());
    REPLAYSSM_CUDA_CHECK(cudaStreamSynchronize(gpu_.stream()));
    const double t1 = now_s();
    timed_kl_phase(policy.to_string(), compute_precision_, t0, t1, cb,
                   [&] { compare_hidden(ref_hidden_, std::nullopt, cfg_hidden_, std::nullopt, targets, chunk_rows, cb); });
    const double t2 = now_s();
    return {t1 - t0, t2 - t1};
  }

  eval::CompareTimes compare_compute_noise_floor(std::span<const int32_t> targets, int chunk_rows,
                                                 const eval::CompareCallbacks& cb) override {
    if (compute_precision_ == GemmPrecision::fp32)
      return eval::SweepEngine::compare_compute_noise_floor(targets, chunk_rows, cb);
    const auto N = static_cast<int64_t>(input_.size());
    if (ref_hidden_.rows() != N || N == 0) throw std::logic_error("SweepEngine::compare before set_reference");
    if (static_cast<int64_t>(targets.size()) != N)
      throw std::invalid_argument(fmt::format("compare: {} targets for {} positions", targets.size(), N));
    if (cb.on_phase) cb.on_phase("forward at FP32 compute");
    const double t0 = now_s();
    cfg_hidden_.resize(N, gpu_.hidden_size());
    gpu_.final_hidden(input_, model::PolicyAssignment(reference_), cfg_hidden_.view(), {}, GemmPrecision::fp32);
    REPLAYSSM_CUDA_CHECK(cudaStreamSynchronize(gpu_.stream()));
    const double t1 = now_s();
    // p: the reference at FP32 compute (its LM head in FP32 too); q: the reference at this compute.
    timed_kl_phase(eval::compute_noise_floor_name(compute_), GemmPrecision::fp32, t0, t1, cb, [&] {
      compare_hidden(cfg_hidden_, GemmPrecision::fp32, ref_hidden_, std::nullopt, targets, chunk_rows, cb);
    });
    return {t1 - t0, now_s() - t1};
  }

 private:
  // The KL phase of a pass that began at t0 and whose forward (at `forward_precision`) ended at t1:
  // `kl` runs it; with timing on, its LM-head products are tallied and the pass's timing line logged.
  void timed_kl_phase(const std::string& name, GemmPrecision forward_precision, double t0, double t1,
                      const eval::CompareCallbacks& cb, const std::function<void()>& kl) {
    if (cb.on_phase) cb.on_phase("KL");
    GemmTally tally;
    std::optional<ScopedGemmTally> tally_scope;
    int kl_id = -1;
    if (timing_) {
      if (!kl_intervals_) kl_intervals_ = std::make_unique<GpuIntervals>(2);
      kl_intervals_->clear();
      tally.intervals = kl_intervals_.get();
      tally.category = 1;
      tally_scope.emplace(&tally);
      kl_id = kl_intervals_->begin(0, gpu_.stream());
    }
    kl();
    const double t2 = now_s();
    if (!timing_) return;
    kl_intervals_->end(kl_id, gpu_.stream());
    const std::vector<double> t = kl_intervals_->collect();
    const double kl_s = t[0], head = t[1], wall = t2 - t0;
    const auto N = static_cast<int64_t>(input_.size());
    log_ << fmt::format(
        "kl-sweep: GPU timing, {}: {} positions in {:.2f} s wall ({:.0f} tokens/s; forward {:.2f} s, KL {:.2f} s); "
        "{}; KL {:.2f} s = LM head {:.2f} s (both distributions, {:.1f} TFLOP, {}) + log-softmax, KL and "
        "results {:.2f} s\n",
        name, N, wall, static_cast<double>(N) / wall, t1 - t0, t2 - t1, forward_split(gpu_.last_timing(), forward_precision),
        kl_s, head, tally.flops / 1e12,
        rate(compute_precision_ == GemmPrecision::fp32 ? tally.flops : tally.tensor_flops, head), kl_s - head);
  }

  // Both distributions' logits chunk by chunk (the LM head at p_gemm / q_gemm; unset: the model's
  // own precision) and their comparison on the GPU; the results to cb.on_results.
  void compare_hidden(const DeviceMatrixBuffer& p_hidden, std::optional<GemmPrecision> p_gemm,
                      const DeviceMatrixBuffer& q_hidden, std::optional<GemmPrecision> q_gemm,
                      std::span<const int32_t> targets, int chunk_rows, const eval::CompareCallbacks& cb) {
    const auto N = static_cast<int64_t>(input_.size());
    const int vocab = gpu_.vocab_size();
    targets_.upload(targets.data(), targets.size(), gpu_.stream());
    const int64_t chunk = std::min<int64_t>(chunk_rows, N);
    logits_ref_.resize(chunk, vocab);
    logits_cfg_.resize(chunk, vocab);
    std::vector<eval::PositionResult> results;
    for (int64_t p0 = 0; p0 < N; p0 += chunk) {
      const int64_t rows = std::min<int64_t>(chunk, N - p0);
      const DeviceMatrix lp = logits_ref_.view().middle_rows(0, rows), lq = logits_cfg_.view().middle_rows(0, rows);
      gpu_.lm_logits(p_hidden.view().middle_rows(p0, rows), lp, p_gemm);
      gpu_.lm_logits(q_hidden.view().middle_rows(p0, rows), lq, q_gemm);
      results.resize(static_cast<std::size_t>(rows));
      compare_positions_gpu(lp, lq, targets_.data() + p0, results, gpu_.stream());
      if (cb.on_results) cb.on_results(p0, results);
    }
  }

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
  GemmPrecision compute_precision_ = GemmPrecision::fp32;
  bool timing_ = false;
  std::unique_ptr<GpuIntervals> kl_intervals_;
  std::vector<int32_t> input_;
  ssm::PrecisionPolicy reference_;
  DeviceMatrixBuffer ref_hidden_, cfg_hidden_, logits_ref_, logits_cfg_;
  DeviceBuffer<int32_t> targets_;
};

}  // namespace

std::string bind_device_for_local_rank(int local_rank) {
  if (local_rank < 0) throw std::invalid_argument(fmt::format("bind_device_for_local_rank: local rank {}", local_rank));
  int count = 0;
  REPLAYSSM_CUDA_CHECK(cudaGetDeviceCount(&count));
  if (count < 1) throw std::runtime_error("bind_device_for_local_rank: no CUDA device");
  const int device = local_rank % count;
  REPLAYSSM_CUDA_CHECK(cudaSetDevice(device));
  return fmt::format("GPU {} of {} (local rank {} % {})", device, count, local_rank, count);
}

std::unique_ptr<eval::SweepEngine> make_cuda_engine(model::TeacherForcedModel& model, GemmPrecision compute,
                                                    int chunk_rows, std::ostream& log) {
  if (const std::string why = cuda_unavailable_reason(); !why.empty()) throw std::runtime_error("--device cuda: " + why);
  if (const std::string why = cuda_engine_unsupported_reason(model); !why.empty())
    throw std::runtime_error("--device cuda: " + why);
  return std::make_unique<CudaEngine>(model, compute, chunk_rows, log);
}

}  // namespace replayssm::cuda
