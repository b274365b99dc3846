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
// Expert matrices are held as the float32 buffers the loader read, each expert's once (a fused
// tensor is sliced in place, never copied out).
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

// One weight matrix per expert (rows x cols each), viewed in the buffers read from the checkpoint.
class ExpertMatrices {
 public:
  ExpertMatrices() = default;
  // Per-expert tensors: one buffer each, moved in.
  ExpertMatrices(std::vector<std::vector<float>> per_expert, int rows, int cols);
  // Views into a fused buffer: expert e's matrix starts at e * stride + offset floats.
  ExpertMatrices(std::shared_ptr<const std::vector<float>> fused, int n_experts, int rows, int cols,
                 std::size_t stride, std::size_t offset);
  Eigen::Map<const Mat> operator()(int e) const { return {ptr_[static_cast<std::size_t>(e)], rows_, cols_}; }
  int rows() const { return rows_; }
  int cols() const { return cols_; }

 private:
  int rows_ = 0, cols_ = 0;
  std::vector<std::shared_ptr<const std::vector<float>>> storage_;
  std::vector<const float*> ptr_;
};

class MixtureOfExperts final : public Block {
 public:
  // Reads and checks every tensor of the layer; a missing expert or a tensor of the wrong shape
  // throws std::runtime_error naming the file, the tensor and the expected shape.
  MixtureOfExperts(WeightLoader& w, const std::string& prefix, const MoeShape& s, int hidden);
  void forward(const Mat& x, Mat& out, const LayerContext& ctx) const override;
  // The router's choice for the rows of x (for tests and the routing-spread checks).
  Routing route_rows(const Mat& x, int threads) const;
  // Floats of the largest buffers forward() holds for `rows` positions at once (router logits,
  // routing, the experts' per-slot outputs, the latent input, the shared expert), counted by
  // MoeShape alone so `info` can state it without loading anything.
  static int64_t activation_floats(const MoeShape& s, int hidden, int64_t rows);

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
