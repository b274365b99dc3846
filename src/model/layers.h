// The blocks of the supported architectures, each a token mixer (or MLP) that maps normalised
// hidden states x (N positions x hidden) to the block's output (N x hidden), to be added to the
// residual stream by the caller. Weights are loaded by name from a TensorStore; the SSM
// recurrence of Mamba-2, Gated DeltaNet and KDA runs through ssm::emulate_sequence under the layer's
// PrecisionPolicy, one call per key-head group (the group's value heads together, so stochastic
// rounding streams do not depend on the thread count).
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "model/model_config.h"
#include "model/quantized_weights.h"
#include "model/safetensors.h"
#include "model/tensor_ops.h"
#include "ssm/precision_policy.h"
#include "ssm/sequence_emulator.h"

namespace replayssm::model {

// A weight matrix left in the memory-mapped checkpoint (expert weights, model/moe.h): the loader
// checks its shape and dtype (or its quantized codes and scales) when the model loads; fetch()
// converts it to float32 each time it is needed. Its TensorStore must outlive it.
class StoredMatrix {
 public:
  int rows() const { return rows_; }
  int cols() const { return cols_; }
  // Bytes of the checkpoint it reads (a quantized matrix: its codes and scales).
  uint64_t stored_bytes() const { return stored_bytes_; }
  // Rows [row0, row0 + rows) of this matrix (a fused gate_up tensor's halves); float storage only.
  StoredMatrix row_slice(int row0, int rows) const;
  // The float32 values, row-major, into `out` (resized to rows x cols): the values
  // WeightLoader::matrix() reads, bit for bit. Several threads may fetch at once.
  void fetch(std::vector<float>& out) const;

 private:
  friend class WeightLoader;
  TensorStore* store_ = nullptr;
  const SafetensorsFile* file_ = nullptr;
  const TensorInfo* info_ = nullptr;
  uint64_t first_ = 0;  // first element inside the stored tensor (an expert of a fused tensor)
  std::string name_;
  std::shared_ptr<const WeightQuantization> quantization_;  // set: stored quantized
  int rows_ = 0, cols_ = 0;
  uint64_t stored_bytes_ = 0;
};

// Reads float32 weights with checked shapes; counts parameters. With `shapes_only` nothing is
// read (the matrices stay empty) but presence and shapes are still validated. With a
// QuantizedWeightReader (a quantized checkpoint), matrices stored quantized are dequantized.
class WeightLoader {
 public:
  WeightLoader(TensorStore& store, bool shapes_only, QuantizedWeightReader* quantized = nullptr)
      : store_(store),
        shapes_only_(shapes_only),
        quantized_(quantized),
        quantization_(quantized ? std::make_shared<const WeightQuantization>(quantized->quantization()) : nullptr) {}
  Mat matrix(const std::string& name, int rows, int cols);
  Vec vector(const std::string& name, int n);
  // torch Conv1d depthwise weight [channels, 1, k] -> channels x k.
  Mat conv_weight(const std::string& name, int channels, int k);
  // A tensor of any shape (e.g. [1, 1, heads, 1]), its values in storage order.
  Vec flat(const std::string& name, const std::vector<int64_t>& shape);
  Linear linear(const std::string& prefix, int out, int in, bool bias);
  // The tensor's float32 values as read (row-major, `shape` checked), handed over without a copy.
  // Empty with shapes_only.
  std::vector<float> values(const std::string& name, const std::vector<int64_t>& shape);
  // The rows x cols matrix `name`, checked now (presence, shape, dtype; quantized: codes and
  // scales) and read later (StoredMatrix::fetch).
  StoredMatrix stored_matrix(const std::string& name, int rows, int cols);
  // The matrices of a fused float tensor [n, rows, cols] (checked now), one per leading index.
  std::vector<StoredMatrix> stored_stack(const std::string& name, int n, int rows, int cols);
  // Parameters and checkpoint bytes of the matrices left stored (included in parameter_count()).
  std::size_t stored_parameter_count() const { return stored_parameters_; }
  uint64_t stored_bytes() const { return stored_bytes_; }
  // Largest float32 scratch a fetch of a stored quantized matrix takes besides the matrix (its
  // block scales as float32); 0 when none is stored quantized.
  int64_t stored_scratch_floats() const { return stored_scratch_floats_; }
  bool shapes_only() const { return shapes_only_; }
  bool contains(const std::string& name) const { return store_.contains(name); }
  std::string files_description() const { return store_.files_description(); }  // for messages
  std::size_t parameter_count() const { return parameters_; }

 private:
  TensorStore& store_;
  bool shapes_only_;
  QuantizedWeightReader* quantized_;
  std::shared_ptr<const WeightQuantization> quantization_;  // quantized_'s, for stored matrices
  std::size_t parameters_ = 0, stored_parameters_ = 0;
  uint64_t stored_bytes_ = 0;
  int64_t stored_scratch_floats_ = 0;
};

// Shown every head group's recurrence inputs (decays, keys, values) by the SSM mixers just before
// the emulator runs them, for diagnostics (model/decay_spectrum.h). Called from several worker
// threads at once: the observer synchronises itself.
using SequenceObserver = std::function<void(const ssm::HeadGroupSequence& seq, ssm::HeadGroupId id)>;

struct LayerContext {
  int layer_index = 0;                           // block index in the model (SR stream id)
  const ssm::PrecisionPolicy* policy = nullptr;  // SSM layers: how the state is stored/decoded
  int threads = 1;
  const SequenceObserver* observe = nullptr;     // optional
};

class Block {
 public:
  virtual ~Block() = default;
  // x: N x hidden (normalised input); out: resized to N x hidden.
  virtual void forward(const Mat& x, Mat& out, const LayerContext& ctx) const = 0;
};

// Mamba-2 mixer (transformers Mamba2Mixer / NemotronHMamba2Mixer): in_proj -> [z | xBC | dt],
// causal conv + SiLU on xBC, dt = clamp(softplus(dt + dt_bias)), A = -exp(A_log),
// recurrence with v = dt x, alpha = exp(dt A), k = B, q = C (per group), y = o + D x,
// gated RMSNorm (y * silu(z), normalised over norm_group_size) -> out_proj.
class Mamba2Mixer final : public Block {
 public:
  Mamba2Mixer(WeightLoader& w, const std::string& prefix, const Mamba2Shape& s, int hidden);
  void forward(const Mat& x, Mat& out, const LayerContext& ctx) const override;

  // Read-only views of the weights, for the GPU twin (cuda/model) that uploads them.
  const Mamba2Shape& shape() const { return s_; }
  const Linear& in_proj() const { return in_proj_; }
  const Linear& out_proj() const { return out_proj_; }
  const Mat& conv_weight() const { return conv_w_; }
  const Vec& conv_bias() const { return conv_b_; }
  const Vec& dt_bias() const { return dt_bias_; }
  const Vec& a_log() const { return a_log_; }
  const Vec& d_skip() const { return d_; }
  const Vec& norm_weight() const { return norm_w_; }

 private:
  Mamba2Shape s_;
  Linear in_proj_, out_proj_;
  Mat conv_w_;
  Vec conv_b_, dt_bias_, a_log_, d_, norm_w_;
};

// Gated DeltaNet (transformers Qwen3_5GatedDeltaNet): in_proj_qkv -> conv + SiLU -> q, k, v;
// q, k L2-normalised (eps 1e-6), q scaled by dk^-1/2; beta = sigmoid(in_proj_b x),
// alpha = exp(-exp(A_log) softplus(in_proj_a x + dt_bias)); value head h reads key head
// h / (num_v_heads / num_k_heads); per-head RMSNorm(o) * w * silu(z) -> out_proj.
class GatedDeltaNet final : public Block {
 public:
  GatedDeltaNet(WeightLoader& w, const std::string& prefix, const GdnShape& s, int hidden);
  void forward(const Mat& x, Mat& out, const LayerContext& ctx) const override;

  // Read-only views of the weights, for the GPU twin (cuda/model) that uploads them.
  const GdnShape& shape() const { return s_; }
  const Linear& in_proj_qkv() const { return in_qkv_; }
  const Linear& in_proj_z() const { return in_z_; }
  const Linear& in_proj_b() const { return in_b_; }
  const Linear& in_proj_a() const { return in_a_; }
  const Linear& out_proj() const { return out_proj_; }
  const Mat& conv_weight() const { return conv_w_; }
  const Vec& dt_bias() const { return dt_bias_; }
  const Vec& a_log() const { return a_log_; }
  const Vec& norm_weight() const { return norm_w_; }

 private:
  GdnShape s_;
  Linear in_qkv_, in_z_, in_b_, in_a_, out_proj_;
  Mat conv_w_;
  Vec dt_bias_, a_log_, norm_w_;
};

// Causal multi-head attention with GQA, computed in blocks with an online softmax (memory
// O(N d), never N x N). Nemotron-H: plain q/k/v/o, no positional encoding. Qwen3.5: q_proj also
// yields a per-head output gate (sigmoid), (1+w) RMSNorm on q and k per head, partial RoPE.
class Attention final : public Block {
 public:
  Attention(WeightLoader& w, const std::string& prefix, const AttentionShape& s, int hidden);
  void forward(const Mat& x, Mat& out, const LayerContext& ctx) const override;

  // Read-only views of the weights, for the GPU twin (cuda/model) that uploads them.
  const AttentionShape& shape() const { return s_; }
  const Linear& q_proj() const { return q_; }
  const Linear& k_proj() const { return k_; }
  const Linear& v_proj() const { return v_; }
  const Linear& o_proj() const { return o_; }
  const Vec& q_norm() const { return q_norm_; }
  const Vec& k_norm() const { return k_norm_; }
  const std::vector<float>& inv_freq() const { return inv_freq_; }

 private:
  AttentionShape s_;
  Linear q_, k_, v_, o_;
  Vec q_norm_, k_norm_;
  std::vector<float> inv_freq_;
};

// Nemotron-H: down(relu(up x)^2). Qwen3.5: down(silu(gate x) * up x).
class Mlp final : public Block {
 public:
  Mlp(WeightLoader& w, const std::string& prefix, const MlpShape& s, int hidden);
  void forward(const Mat& x, Mat& out, const LayerContext& ctx) const override;

  // Read-only views of the weights, for the GPU twin (cuda/model) that uploads them.
  const MlpShape& shape() const { return s_; }
  const Linear& gate_proj() const { return gate_; }
  const Linear& up_proj() const { return up_; }
  const Linear& down_proj() const { return down_; }

 private:
  MlpShape s_;
  Linear gate_, up_, down_;
};

// Kimi Delta Attention (transformers KimiLinearDeltaAttention, torch path): q/k/v projections,
// one causal depthwise conv + SiLU over [q | k | v] (no bias); q, k L2-normalised per head
// (x / sqrt(sum x^2 + 1e-6)), q scaled by dk^-1/2; channel-wise decay
// alpha = exp(-exp(A_log[h]) softplus(f_b(f_a x) + dt_bias)), beta = sigmoid(b_proj x);
// per-head gated RMSNorm(o) * w * sigmoid(g_b(g_a x)) -> o_proj. Each head is its own key head.
// Checkpoint spellings: the published layout (q/k/v_conv1d, f_a_proj, dt_bias, A_log directly
// under the layer) or transformers' in-memory one (conv1d, forget_gate.*).
class KdaMixer final : public Block {
 public:
  KdaMixer(WeightLoader& w, const std::string& prefix, const KdaShape& s, int hidden);
  void forward(const Mat& x, Mat& out, const LayerContext& ctx) const override;

  // Read-only views of the weights, for the GPU twin (cuda/model) that uploads them.
  const KdaShape& shape() const { return s_; }
  const Linear& q_proj() const { return q_; }
  const Linear& k_proj() const { return k_; }
  const Linear& v_proj() const { return v_; }
  const Linear& f_a_proj() const { return f_a_; }
  const Linear& f_b_proj() const { return f_b_; }
  const Linear& b_proj() const { return b_; }
  const Linear& g_a_proj() const { return g_a_; }
  const Linear& g_b_proj() const { return g_b_; }
  const Linear& o_proj() const { return o_; }
  const Mat& conv_weight() const { return conv_w_; }
  const Vec& dt_bias() const { return dt_bias_; }
  const Vec& a_log() const { return a_log_; }
  const Vec& norm_weight() const { return norm_w_; }

 private:
  KdaShape s_;
  Linear q_, k_, v_, f_a_, f_b_, b_, g_a_, g_b_, o_;
  Mat conv_w_;  // [q | k | v] channels x kernel
  Vec dt_bias_, a_log_, norm_w_;
};

// Multi-head latent attention of Kimi Linear (transformers KimiLinearAttention, eager): see
// MlaShape. Scores scaled by qk_head_dim^-1/2, causal softmax computed blockwise (O(N d) memory).
class MlaAttention final : public Block {
 public:
  MlaAttention(WeightLoader& w, const std::string& prefix, const MlaShape& s, int hidden);
  void forward(const Mat& x, Mat& out, const LayerContext& ctx) const override;

  // Read-only views of the weights, for the GPU twin (cuda/model) that uploads them.
  const MlaShape& shape() const { return s_; }
  const Linear& q_proj() const { return q_; }
  const Linear& q_a_proj() const { return q_a_; }
  const Linear& q_b_proj() const { return q_b_; }
  const Linear& kv_a_proj() const { return kv_a_; }
  const Linear& kv_b_proj() const { return kv_b_; }
  const Linear& o_proj() const { return o_; }
  const Vec& q_a_norm() const { return q_a_norm_; }
  const Vec& kv_a_norm() const { return kv_a_norm_; }

 private:
  MlaShape s_;
  Linear q_, q_a_, q_b_, kv_a_, kv_b_, o_;
  Vec q_a_norm_, kv_a_norm_;
};

// Blocked causal attention with an online softmax, O(N d) memory: q and k are N x (H dqk) and
// N x (Hkv dqk), v is N x (Hkv dv); returns N x (H dv). Query head h reads key/value head
// h / (H / Hkv). Where `scale` is applied follows each model's transformers code, because the two
// round differently: ScaleAt::query scales q before q k^T (Qwen3.5, Nemotron-H), ScaleAt::scores
// scales q k^T after the product (eager attention of Kimi Linear's MLA).
enum class ScaleAt { query, scores };
struct AttentionHeads {
  int num_heads = 1, num_kv_heads = 1, dqk = 0, dv = 0;
};
Mat causal_attention(const Mat& q, const Mat& k, const Mat& v, const AttentionHeads& heads, float scale,
                     ScaleAt scale_at, int threads, int block = 64);

}  // namespace replayssm::model
