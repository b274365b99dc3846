#include "model/moe.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <stdexcept>

#include <fmt/format.h>

namespace replayssm::model {

namespace {

// torch.topk's order: larger first, NaN above every number; equal values: the lower index first.
bool ranks_above(float a, int ia, float b, int ib) {
  const bool na = std::isnan(a), nb = std::isnan(b);
  if (na != nb) return na;
  if (!na && a != b) return a > b;
  return ia < ib;
}

// The k best of `candidates` by value[candidate] (k <= candidates.size()).
void top_k(const float* value, std::vector<int>& candidates, int k) {
  std::partial_sort(candidates.begin(), candidates.begin() + k, candidates.end(),
                    [&](int a, int b) { return ranks_above(value[a], a, value[b], b); });
  candidates.resize(static_cast<std::size_t>(k));
}

}  // namespace

Routing route(const Mat& logits, const RouterSpec& r, const Vec& bias) {
  const int n_exp = r.n_experts, k = r.top_k;
  if (logits.cols() != n_exp || k <= 0 || k > n_exp || r.n_group <= 0 || n_exp % r.n_group != 0 ||
      r.topk_group <= 0 || r.topk_group > r.n_group || (r.correction_bias && bias.size() != n_exp))
    throw std::invalid_argument(fmt::format("route: {} logits per row for a router of {} experts, top_k {}, n_group {}, "
                                            "topk_group {}, bias of {} (expected a consistent RouterSpec)",
                                            logits.cols(), n_exp, k, r.n_group, r.topk_group, bias.size()));
  const int per_group = n_exp / r.n_group;
  Routing out;
  out.top_k = k;
  out.expert.resize(static_cast<std::size_t>(logits.rows()) * k);
  out.weight.resize(out.expert.size());
  std::vector<float> score(n_exp), choice(n_exp), group_score(r.n_group);
  std::vector<int> candidates, groups;
  for (Eigen::Index row = 0; row < logits.rows(); ++row) {
    const float* l = logits.data() + row * n_exp;
    if (r.score == RouterSpec::Score::softmax) {
      // softmax in float32 (torch: exp(l - max) / sum)
      float mx = l[0];
      for (int e = 1; e < n_exp; ++e) mx = std::max(mx, l[e]);
      float sum = 0.0f;
      for (int e = 0; e < n_exp; ++e) sum += (score[e] = std::exp(l[e] - mx));
      for (int e = 0; e < n_exp; ++e) score[e] /= sum;
    } else {
      for (int e = 0; e < n_exp; ++e) score[e] = sigmoid(l[e]);
    }
    for (int e = 0; e < n_exp; ++e) choice[e] = r.correction_bias ? score[e] + bias[e] : score[e];
    candidates.clear();
    if (r.n_group > 1 && r.topk_group < r.n_group) {
      // A group scores the sum of its two best choice scores; experts of the topk_group best compete.
      for (int g = 0; g < r.n_group; ++g) {
        std::vector<int> members(static_cast<std::size_t>(per_group));
        std::iota(members.begin(), members.end(), g * per_group);
        top_k(choice.data(), members, 2);
        group_score[g] = choice[members[0]] + choice[members[1]];
      }
      groups.resize(static_cast<std::size_t>(r.n_group));
      std::iota(groups.begin(), groups.end(), 0);
      top_k(group_score.data(), groups, r.topk_group);
      for (const int g : groups)
        for (int e = g * per_group; e < (g + 1) * per_group; ++e) candidates.push_back(e);
    } else {
      candidates.resize(static_cast<std::size_t>(n_exp));
      std::iota(candidates.begin(), candidates.end(), 0);
    }
    top_k(choice.data(), candidates, k);
    std::sort(candidates.begin(), candidates.end());  // ascending expert: the order of the sum
    int* idx = out.expert.data() + row * k;
    float* w = out.weight.data() + row * k;
    float total = 0.0f;
    for (int j = 0; j < k; ++j) {
      idx[j] = candidates[j];
      w[j] = score[candidates[j]];
      total += w[j];
    }
    if (r.normalise)
      for (int j = 0; j < k; ++j) w[j] /= total + r.norm_epsilon;
    for (int j = 0; j < k; ++j) w[j] *= r.scaling;
  }
  return out;
}

Eigen::Map<const Mat> ExpertMatrices::fetch(int e, std::vector<float>& buffer) const {
  const StoredMatrix& m = m_[static_cast<std::size_t>(e)];
  m.fetch(buffer);
  return {buffer.data(), m.rows(), m.cols()};
}

namespace {

// Experts' up (and gate) and down matrices, per expert or fused, whichever the checkpoint holds.
struct ExpertTensors {
  ExpertMatrices gate, up, down;
};

ExpertTensors load_experts(WeightLoader& w, const std::string& p, const MoeShape& s, int in) {
  const int n = s.router.n_experts, inter = s.expert_intermediate;
  const bool swiglu = s.activation == ExpertActivation::swiglu;
  const std::string fused_up = p + (swiglu ? ".experts.gate_up_proj" : ".experts.up_proj");
  ExpertTensors t;
  if (!w.contains(fmt::format("{}.experts.0.{}.weight", p, s.expert_up_name)) && w.contains(fused_up)) {
    const int up_rows = swiglu ? 2 * inter : inter;
    std::vector<StoredMatrix> up = w.stored_stack(fused_up, n, up_rows, in);
    t.down = ExpertMatrices(w.stored_stack(p + ".experts.down_proj", n, in, inter));
    if (swiglu) {  // gate rows first, then up rows
      std::vector<StoredMatrix> gate;
      for (StoredMatrix& m : up) {
        gate.push_back(m.row_slice(0, inter));
        m = m.row_slice(inter, inter);
      }
      t.gate = ExpertMatrices(std::move(gate));
    }
    t.up = ExpertMatrices(std::move(up));
    return t;
  }
  // Per-expert tensors (the layout of published checkpoints); a missing one is named by the loader.
  std::vector<StoredMatrix> gate, up, down;
  for (int e = 0; e < n; ++e) {
    const std::string q = fmt::format("{}.experts.{}.", p, e);
    if (swiglu) gate.push_back(w.stored_matrix(q + s.expert_gate_name + ".weight", inter, in));
    up.push_back(w.stored_matrix(q + s.expert_up_name + ".weight", inter, in));
    down.push_back(w.stored_matrix(q + s.expert_down_name + ".weight", in, inter));
  }
  if (swiglu) t.gate = ExpertMatrices(std::move(gate));
  t.up = ExpertMatrices(std::move(up));
  t.down = ExpertMatrices(std::move(down));
  return t;
}

}  // namespace

MixtureOfExperts::MixtureOfExperts(WeightLoader& w, const std::string& p, const MoeShape& s, int hidden)
    : s_(s), hidden_(hidden) {
  const RouterSpec& r = s.router;
  router_ = w.linear(p + ".gate", r.n_experts, hidden, false);
  if (r.correction_bias) correction_bias_ = w.vector(p + ".gate.e_score_correction_bias", r.n_experts);
  const int in = s.latent_size ? s.latent_size : hidden;
  if (s.latent_size) {
    latent_in_ = w.linear(p + ".fc1_latent_proj", s.latent_size, hidden, s.latent_bias);
    latent_out_ = w.linear(p + ".fc2_latent_proj", hidden, s.latent_size, s.latent_bias);
  }
  ExpertTensors t = load_experts(w, p, s, in);
  gate_ = std::move(t.gate);
  up_ = std::move(t.up);
  down_ = std::move(t.down);
  if (s.shared_intermediate) {
    MlpShape m;
    m.intermediate_size = s.shared_intermediate;
    m.activation = s.activation == ExpertActivation::swiglu ? MlpActivation::swiglu : MlpActivation::relu2;
    m.bias = s.shared_bias;
    shared_ = std::make_unique<Mlp>(w, p + "." + s.shared_name, m, hidden);
    if (s.shared_gate) shared_gate_ = w.linear(p + ".shared_expert_gate", 1, hidden, false);
  }
}

Routing MixtureOfExperts::route_rows(const Mat& x, int threads) const {
  Mat logits;
  router_.apply(x, logits, threads);
  return route(logits, s_.router, correction_bias_);
}

// Rows of one expert multiplied at once: fixed, so results do not depend on the thread count.
constexpr int64_t kExpertRows = 128;

int64_t MixtureOfExperts::activation_floats(const MoeShape& s, int hidden, int64_t rows) {
  const int64_t k = s.router.top_k, in = s.latent_size ? s.latent_size : hidden;
  const int64_t router = rows * s.router.n_experts + 2 * rows * k;
  const int64_t experts = rows * k * in + (s.latent_size ? rows * in : 0) + rows * hidden;
  const int64_t shared = s.shared_intermediate ? rows * (2 * int64_t{s.shared_intermediate} + hidden + 1) : 0;
  return router + experts + shared;
}

int64_t MixtureOfExperts::worker_floats(const MoeShape& s, int hidden, int64_t rows) {
  const int64_t in = s.latent_size ? s.latent_size : hidden, inter = s.expert_intermediate;
  const int64_t matrices = (s.activation == ExpertActivation::swiglu ? 3 : 2) * inter * in;
  const int64_t block = std::min(rows, kExpertRows);
  return matrices + block * (2 * in + 2 * inter);  // rows in, up (and gate) products, rows out
}

int64_t MixtureOfExperts::workers(const MoeShape& s, int64_t rows, int threads) {
  return std::min({int64_t{threads}, int64_t{s.router.n_experts}, rows * s.router.top_k});
}

void MixtureOfExperts::forward(const Mat& x, Mat& out, const LayerContext& ctx) const {
  const Eigen::Index n = x.rows();
  const int k = s_.router.top_k, n_exp = s_.router.n_experts;
  const Routing routing = route_rows(x, ctx.threads);
  Mat latent;
  if (s_.latent_size) latent_in_.apply(x, latent, ctx.threads);
  const Mat& z = s_.latent_size ? latent : x;
  const Eigen::Index in = z.cols();

  // Slots (row * k + j) routed to each expert, rows ascending.
  std::vector<std::vector<int64_t>> slots(static_cast<std::size_t>(n_exp));
  for (int64_t slot = 0; slot < static_cast<int64_t>(routing.expert.size()); ++slot)
    slots[static_cast<std::size_t>(routing.expert[slot])].push_back(slot);
  // One task per expert with rows: it converts the expert's matrices once into buffers of its own
  // (released when it ends), then runs its slots in fixed blocks of kExpertRows, the same blocks
  // for any thread count.
  std::vector<int> tasks;
  for (int e = 0; e < n_exp; ++e)
    if (!slots[static_cast<std::size_t>(e)].empty()) tasks.push_back(e);

  Mat contribution(n * k, in);  // each slot's weighted expert output
  parallel_for(static_cast<int>(tasks.size()), ctx.threads, [&](int ti) {
    const int expert = tasks[static_cast<std::size_t>(ti)];
    const std::vector<int64_t>& s = slots[static_cast<std::size_t>(expert)];
    std::vector<float> up_buffer, gate_buffer, down_buffer;
    const Eigen::Map<const Mat> up = up_.fetch(expert, up_buffer), down = down_.fetch(expert, down_buffer);
    const Eigen::Map<const Mat> gate =
        gate_.empty() ? Eigen::Map<const Mat>(nullptr, 0, 0) : gate_.fetch(expert, gate_buffer);
    for (int64_t begin = 0; begin < static_cast<int64_t>(s.size()); begin += kExpertRows) {
      const Eigen::Index rows = std::min<int64_t>(kExpertRows, static_cast<int64_t>(s.size()) - begin);
      Mat xin(rows, in);
      for (Eigen::Index i = 0; i < rows; ++i) xin.row(i) = z.row(s[begin + i] / k);
      Mat h = xin * up.transpose();
      if (s_.activation == ExpertActivation::swiglu) {
        const Mat g = xin * gate.transpose();
        h.array() *= g.array().unaryExpr([](float a) { return silu(a); });
      } else {
        h = h.array().max(0.0f).square().matrix();
      }
      const Mat y = h * down.transpose();
      for (Eigen::Index i = 0; i < rows; ++i) {
        const int64_t slot = s[begin + i];
        contribution.row(slot) = y.row(i) * routing.weight[static_cast<std::size_t>(slot)];
      }
    }
  });
  // Each row: 0 + its experts' contributions in ascending expert order (the slots' order).
  Mat routed = Mat::Zero(n, in);
  for (Eigen::Index row = 0; row < n; ++row)
    for (int j = 0; j < k; ++j) routed.row(row) += contribution.row(row * k + j);
  if (s_.latent_size)
    latent_out_.apply(routed, out, ctx.threads);
  else
    out = std::move(routed);
  if (shared_) {
    Mat shared;
    shared_->forward(x, shared, ctx);
    if (s_.shared_gate) {
      Mat gate;
      shared_gate_.apply(x, gate, ctx.threads);
      for (Eigen::Index row = 0; row < n; ++row) shared.row(row) *= sigmoid(gate(row, 0));
    }
    out += shared;
  }
}

}  // namespace replayssm::model
