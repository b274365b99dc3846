#include "eval/sweep_engine.h"

#include <chrono>
#include <stdexcept>
#include <vector>

#include <fmt/format.h>

namespace replayssm::eval {

using model::RowMatrixXf;
using model::TeacherForcedModel;

namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

RowMatrixXf checked_hidden(TeacherForcedModel& model, std::span<const int32_t> input,
                           const ssm::PrecisionPolicy& policy) {
  RowMatrixXf h = model.final_hidden(input, policy);
  if (h.rows() != static_cast<Eigen::Index>(input.size()) || h.cols() != model.hidden_size())
    throw std::runtime_error(fmt::format("model.final_hidden({}) returned {}x{}, expected {}x{}", policy.to_string(),
                                         h.rows(), h.cols(), input.size(), model.hidden_size()));
  return h;
}

class CpuEngine final : public SweepEngine {
 public:
  CpuEngine(TeacherForcedModel& model, int threads) : model_(model), threads_(threads) {}
  const TeacherForcedModel& model() const override { return model_; }
  std::string device() const override { return "cpu"; }
  std::string compute() const override { return "fp32"; }

  void set_reference(std::span<const int32_t> input, const ssm::PrecisionPolicy& policy) override {
    input_.assign(input.begin(), input.end());
    ref_hidden_ = checked_hidden(model_, input, policy);
  }

  std::vector<float> reference_hidden() const override {
    if (ref_hidden_.rows() == 0) throw std::logic_error("SweepEngine::reference_hidden before set_reference");
    return std::vector<float>(ref_hidden_.data(), ref_hidden_.data() + ref_hidden_.size());
  }

  void set_reference_hidden(std::span<const int32_t> input, const ssm::PrecisionPolicy&,
                            std::span<const float> hidden) override {
    const auto N = static_cast<Eigen::Index>(input.size());
    const Eigen::Index d = model_.hidden_size();
    check_reference_hidden_size(hidden.size(), N, d);
    input_.assign(input.begin(), input.end());
    ref_hidden_ = Eigen::Map<const RowMatrixXf>(hidden.data(), N, d);
  }

  CompareTimes compare(const ssm::PrecisionPolicy& policy, std::span<const int32_t> targets, int chunk_rows,
                       const CompareCallbacks& cb) override {
    if (ref_hidden_.rows() == 0 && !input_.empty())
      throw std::logic_error("SweepEngine::compare before set_reference");
    const auto N = static_cast<int64_t>(input_.size());
    if (static_cast<int64_t>(targets.size()) != N)
      throw std::invalid_argument(fmt::format("compare: {} targets for {} positions", targets.size(), N));
    const int vocab = model_.vocab_size();
    if (cb.on_phase) cb.on_phase("forward");
    const double t0 = now_s();
    const RowMatrixXf h = checked_hidden(model_, input_, policy);
    const double t1 = now_s();
    if (cb.on_phase) cb.on_phase("KL");
    std::vector<PositionResult> results;
    for (int64_t p0 = 0; p0 < N; p0 += chunk_rows) {
      const int64_t rows = std::min<int64_t>(chunk_rows, N - p0);
      const RowMatrixXf lr = model_.log_probs(ref_hidden_.middleRows(p0, rows));
      const RowMatrixXf lc = model_.log_probs(h.middleRows(p0, rows));
      if (lr.rows() != rows || lr.cols() != vocab || lc.rows() != rows || lc.cols() != vocab)
        throw std::runtime_error(fmt::format("model.log_probs returned {}x{} and {}x{} for {} rows, expected {} "
                                             "columns (vocab_size)",
                                             lr.rows(), lr.cols(), lc.rows(), lc.cols(), rows, vocab));
      results.resize(static_cast<std::size_t>(rows));
      compare_positions(lr.data(), lc.data(), rows, vocab, vocab, targets.data() + p0, results.data(), threads_);
      if (cb.on_results) cb.on_results(p0, results);
    }
    return {t1 - t0, now_s() - t1};
  }

 private:
  TeacherForcedModel& model_;
  int threads_;
  std::vector<int32_t> input_;
  RowMatrixXf ref_hidden_;
};

}  // namespace

void check_reference_hidden_size(std::size_t floats, int64_t positions, int64_t hidden_size) {
  if (static_cast<int64_t>(floats) != positions * hidden_size)
    throw std::invalid_argument(fmt::format("set_reference_hidden: {} floats for {} positions x hidden size {} (= {})",
                                            floats, positions, hidden_size, positions * hidden_size));
}

std::vector<float> SweepEngine::reference_hidden() const {
  throw std::logic_error(fmt::format("the {} engine cannot hand its reference to another process", device()));
}

void SweepEngine::set_reference_hidden(std::span<const int32_t>, const ssm::PrecisionPolicy&, std::span<const float>) {
  throw std::logic_error(fmt::format("the {} engine cannot take a reference computed by another process", device()));
}

CompareTimes SweepEngine::compare_compute_noise_floor(std::span<const int32_t>, int, const CompareCallbacks&) {
  throw std::logic_error(fmt::format("compare_compute_noise_floor: the {} engine computes in {}: no noise floor", device(),
                                     compute()));
}

std::string compute_noise_floor_name(const std::string& compute) { return "noise-floor:" + compute + "-vs-fp32"; }

std::unique_ptr<SweepEngine> make_cpu_engine(model::TeacherForcedModel& model, int threads) {
  return std::make_unique<CpuEngine>(model, threads);
}

}  // namespace replayssm::eval
