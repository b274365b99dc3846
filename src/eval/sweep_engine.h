// Where a KL sweep's numbers are computed (issue 10 "one sweep runner, two backends"): the runner
// (kl_sweep.h) owns books, cells, resume and files; an engine owns a model on a device and does,
// per book, the reference forward once and then, per configuration, the configuration's forward
// and the per-position comparison (kl_metrics.h PositionResult), handing results back in chunks
// of consecutive positions. The CPU engine is below; the CUDA engine (cuda/eval/cuda_sweep_engine.h)
// keeps the reference's hidden states and both distributions on the GPU, so only per-position
// results reach the host.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "eval/kl_metrics.h"
#include "model/teacher_forced_model.h"
#include "ssm/precision_policy.h"

namespace replayssm::eval {

struct CompareTimes {
  double forward_seconds = 0.0, kl_seconds = 0.0;
};

// on_phase("forward"), on_phase("KL") as the work moves on; on_results(first, results) for
// consecutive chunks of positions covering [0, N) in order.
struct CompareCallbacks {
  std::function<void(std::string_view phase)> on_phase;
  std::function<void(int64_t first, std::span<const PositionResult> results)> on_results;
};

class SweepEngine {
 public:
  virtual ~SweepEngine() = default;
  // The model as the sweep identity sees it (vocabulary, description, content hash).
  virtual const model::TeacherForcedModel& model() const = 0;
  // Recorded with every cell and in the result file: "cpu", or "cuda: NVIDIA H200 (sm_90), compute fp32".
  virtual std::string device() const = 0;
  // The compute precision of the non-recurrent layers: "fp32" (the reference semantics) or "bf16".
  virtual std::string compute() const = 0;
  // Runs `policy` (the reference) over `input` and keeps what compare() needs of it.
  virtual void set_reference(std::span<const int32_t> input, const ssm::PrecisionPolicy& policy) = 0;
  // A multi-process sweep (docs/MPI_SWEEP.md) computes a book's reference once and hands it to the
  // other ranks: reference_hidden() is the last set_reference's final hidden states (N x
  // hidden_size floats, row-major) on the host; set_reference_hidden() makes an engine of the same
  // model and compute take them as its reference for `input` under `policy`, exactly as if its own
  // set_reference had computed them (the bits are the reference's: per-position KL is unchanged).
  // The defaults throw std::logic_error (an engine that cannot share its reference).
  virtual std::vector<float> reference_hidden() const;
  virtual void set_reference_hidden(std::span<const int32_t> input, const ssm::PrecisionPolicy& policy,
                                    std::span<const float> hidden);
  // Runs `policy` over the reference's input and compares both next-token distributions at every
  // position (targets[i]: the true next token of position i), chunk_rows positions at a time.
  // Throws std::logic_error without a reference, std::runtime_error on model outputs of the wrong shape.
  virtual CompareTimes compare(const ssm::PrecisionPolicy& policy, std::span<const int32_t> targets, int chunk_rows,
                               const CompareCallbacks& callbacks) = 0;
  // Engines computing below FP32 (compute() != "fp32"): the noise floor the configurations are
  // measured against (issue 10, --compute bf16) — the reference policy run at FP32 compute (p) and
  // at this engine's compute (q, the reference of every configuration), compared per position:
  // KL(p_fp32 compute || p_this compute). Throws std::logic_error on an FP32 engine.
  virtual CompareTimes compare_compute_noise_floor(std::span<const int32_t> targets, int chunk_rows,
                                                   const CompareCallbacks& callbacks);
};

// set_reference_hidden's check: `floats` must be positions x hidden_size (std::invalid_argument).
void check_reference_hidden_size(std::size_t floats, int64_t positions, int64_t hidden_size);

// The result-file name of the compute noise floor's configuration ("noise-floor:bf16-vs-fp32"):
// stored beside the configurations, its per-position KL is KL(p_fp32 compute || p_COMPUTE).
std::string compute_noise_floor_name(const std::string& compute);

// The CPU engine: TeacherForcedModel::final_hidden and log_probs, compared by compare_positions
// on `threads` threads (0: hardware). The model must outlive the engine.
std::unique_ptr<SweepEngine> make_cpu_engine(model::TeacherForcedModel& model, int threads);

}  // namespace replayssm::eval
