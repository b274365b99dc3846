// Mixture-of-experts layers (transformers 5.17: NemotronHMoE, Qwen3_5MoeSparseMoeBlock,
// KimiLinearMoE; Kimi Linear's DeepSeek-style sigmoid router is the same RouterSpec as Nemotron-H's):
//
//   logits = x W_gate^T                       router, float32, one logit per expert
//   (experts, weights) = route(logits)        RouterSpec (model_config.h): softmax or sigmoid
//                                             scores, correction bias, grouped top-k, renorm, scaling
//   y_t = sum over chosen e, in ascending e:  w_te * down_e(act(up_e z_t))   z = x, or fc1_latent(x)
//   y = fc2_latent(y) (when latent)  +  shared(x) (times sigmoid(shared_expert_gate x) when gated)
//
// Each expert runs only on the rows routed to it, in fixed blocks of rows (never per thread), and a
// row's sum is taken in ascending expert order, as transformers' index_add does: results are
// bitwise independent of the thread count and of how positions are chunked.
//
// Tensors under PREFIX (Nemotron-H "model.layers.N.mixer", Qwen3.5-MoE "model.layers.N.mlp", Kimi
// Linear "model.layers.N.block_sparse_moe" or "model.layers.N.mlp"):
//   gate.weight [E, H]; gate.e_score_correction_bias [E] (sigmoid routers)
//   experts.{e}.up_proj.weight [I, in], experts.{e}.down_proj.weight [in, I], and for SwiGLU
//   experts.{e}.gate_proj.weight [I, in]  (checkpoints on disk; Kimi Linear's names are w3, w2 and
//   w1: MoeShape's expert_*_name)   -- or the fused form transformers
//   holds in memory: experts.up_proj [E, I, in] / experts.gate_up_proj [E, 2I, in] (gate rows first)
//   and experts.down_proj [E, in, I]
//   SHARED.{gate,up,down}_proj.weight (model/layers.h Mlp), shared_expert_gate.weight [1, H]
//   fc1_latent_proj [latent, H], fc2_latent_proj [H, latent] (Nemotron-H with moe_latent_size)
// Expert matrices stay in the memory-mapped checkpoint (checked when the model loads): each
// expert's are converted to float32 (or dequantized) when the forward reaches that expert, into
// buffers of the worker thread that runs it and released after, so at most one expert per worker
// thread is held as float32, never all of them.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "model/layers.h"
#include "model/model_config.h"

namespace replayssm::model {

// The experts chosen for each row: expert[r * top_k + j] with weight[r * top_k + j], slots in
// ascending expert order.
struct Routing {
  int top_k = 0;
  std::vector<int> expert;
  std::vector<float> weight;
};

// Routes every row of `logits` (rows x spec.n_experts, float32) as transformers' routers do.
// `bias` is the e_score_correction_bias (spec.n_experts values) when spec.correction_bias, else
// empty. Ties in a top-k pick the lower index; NaN ranks above every number (torch.topk's order).
Routing route(const Mat& logits, const RouterSpec& spec, const Vec& bias);

// One weight matrix per expert (rows x cols each), left in the checkpoint (model/layers.h StoredMatrix).
class ExpertMatrices {
 public:
  ExpertMatrices() = default;
  explicit ExpertMatrices(std::vector<StoredMatrix> per_expert) : m_(std::move(per_expert)) {}
  // Expert e's matrix converted to float32 into `buffer`, viewed in it.
  Eigen::Map<const Mat> fetch(int e, std::vector<float>& buffer) const;
  bool empty() const { return m_.empty(); }
  int count() const { return static_cast<int>(m_.size()); }  // experts
  // Floats of one expert's matrix (all experts have the same shape).
  int64_t floats() const { return m_.empty() ? 0 : int64_t{m_[0].rows()} * m_[0].cols(); }

 private:
  std::vector<StoredMatrix> m_;
};

class MixtureOfExperts final : public Block {
 public:
  // Reads and checks every tensor of the layer; a missing expert or a tensor of the wrong shape
  // throws std::runtime_error naming the file, the tensor and the expected shape.
  MixtureOfExperts(WeightLoader& w, const std::string& prefix, const MoeShape& s, int hidden);
  void forward(const Mat& x, Mat& out, const LayerContext& ctx) const override;
  // The router's choice for the rows of x (for tests and the routing-spread checks).
  Routing route_rows(const Mat& x, int threads) const;
  // Floats of the largest buffers forward() holds for `rows` positions at once, besides those of
  // its worker threads (router logits, routing, the experts' per-slot outputs, the latent input,
  // the shared expert), counted by MoeShape alone so `info` can state it without loading anything.
  static int64_t activation_floats(const MoeShape& s, int hidden, int64_t rows);
  // Floats one worker thread holds while it runs an expert: the expert's matrices as float32 and
  // the products of one block of at most 128 of its rows.
  static int64_t worker_floats(const MoeShape& s, int hidden, int64_t rows);
  // Worker threads running experts at once: min(threads, experts, rows x top_k).
  static int64_t workers(const MoeShape& s, int64_t rows, int threads);

  // Read-only views of the weights, for the GPU twin (cuda/model) that uploads them.
  const MoeShape& shape() const { return s_; }
  int hidden() const { return hidden_; }
  const Linear& router() const { return router_; }
  const Vec& correction_bias() const { return correction_bias_; }  // empty unless router.correction_bias
  const ExpertMatrices& gate_experts() const { return gate_; }     // empty unless SwiGLU experts
  const ExpertMatrices& up_experts() const { return up_; }
  const ExpertMatrices& down_experts() const { return down_; }
  const Mlp* shared_expert() const { return shared_.get(); }  // null without a shared expert
  const Linear& shared_expert_gate() const { return shared_gate_; }  // 1 x hidden when shape().shared_gate
  const Linear& latent_in() const { return latent_in_; }            // latent x hidden when shape().latent_size
  const Linear& latent_out() const { return latent_out_; }          // hidden x latent when shape().latent_size

 private:
  MoeShape s_;
  int hidden_ = 0;
  Linear router_;
  Vec correction_bias_;
  ExpertMatrices gate_, up_, down_;  // gate_ only for SwiGLU experts
  std::unique_ptr<Mlp> shared_;
  Linear shared_gate_, latent_in_, latent_out_;
};

}  // namespace replayssm::model
