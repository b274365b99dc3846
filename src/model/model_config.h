// Model configuration read from a Hugging Face config.json, for the architectures the loader
// supports (transformers 5.x modelling code is the definition followed):
//   mamba2         Mamba2ForCausalLM             every block: RMSNorm -> Mamba-2 mixer
//   nemotron_h     NemotronHForCausalLM          blocks by pattern: M Mamba-2, * attention, - MLP
//                                                E mixture of experts (sigmoid grouped routing, relu2)
//   qwen3_5_text   Qwen3_5ForCausalLM            decoder layers: Gated DeltaNet or gated attention,
//   (qwen3_5: its text_config)                   each followed by a SwiGLU MLP; (1+w) RMSNorms
//   qwen3_5_moe_text Qwen3_5MoeForCausalLM       as qwen3_5, every MLP a mixture of experts (softmax
//   (qwen3_5_moe: its text_config)               top-k, SwiGLU experts, sigmoid-gated shared expert)
//   kimi_linear    KimiLinearForCausalLM         decoder layers: Kimi Delta Attention or multi-head
//                                                latent attention, each followed by a SwiGLU MLP or
//                                                ("sparse" layers) a mixture of experts (sigmoid
//                                                grouped routing, SwiGLU experts, shared experts)
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace replayssm::model {

// Every width of a layer (a product or sum of config fields: num_heads * head_dim, in_proj's
// output, ...) is at most kMaxWidth, so widths and the index sums of the forward pass fit an
// int. The loader refuses a config past it, naming the keys; the width helpers below compute in
// 64 bits and throw std::length_error for a shape built by hand past it, so nothing can overflow.
inline constexpr int64_t kMaxWidth = int64_t{1} << 28;
inline constexpr int64_t kMaxLayers = int64_t{1} << 16;
// `width` as an int, or std::length_error naming `formula` when it is negative or above kMaxWidth.
int checked_width(int64_t width, const char* formula);

enum class Architecture { mamba2, nemotron_h, qwen3_5, kimi_linear };
std::string to_string(Architecture a);

// What mixes tokens (or not) in one block.
enum class LayerKind { mamba2, gated_deltanet, attention, mlp, moe, kda, mla };
char pattern_char(LayerKind k);      // M, G, *, -, E, K, * (MLA is the attention of its architecture)
std::string to_string(LayerKind k);  // "mamba2", ...
bool is_ssm_layer(LayerKind k);      // a recurrence whose state a PrecisionPolicy stores (M, G, K)

struct Mamba2Shape {
  int num_heads = 0, head_dim = 0;   // value heads and dv
  int state_size = 0, n_groups = 0;  // dk and key heads (B and C are shared by the heads of a group)
  int conv_kernel = 4;
  bool conv_bias = true, proj_bias = false;
  double dt_min = 0.0, dt_max = 0.0;  // clamp of softplus(dt + dt_bias) (dt_max may be +inf)
  int norm_group_size = 0;            // gated RMSNorm groups (mamba2: whole width; nemotron_h: width/n_groups)
  double norm_eps = 1e-5;
  int intermediate() const { return checked_width(int64_t{num_heads} * head_dim, "num_heads * head_dim"); }
  int conv_dim() const {  // [x | B | C]
    return checked_width(int64_t{intermediate()} +
                             2 * int64_t{checked_width(int64_t{n_groups} * state_size, "n_groups * state_size")},
                         "conv_dim");
  }
  int in_proj_width() const {  // [z | xBC | dt]
    return checked_width(int64_t{intermediate()} + conv_dim() + num_heads, "in_proj width");
  }
};

struct GdnShape {
  int num_k_heads = 0, num_v_heads = 0, dk = 0, dv = 0;
  int conv_kernel = 4;
  double norm_eps = 1e-6;
  int key_dim() const { return checked_width(int64_t{num_k_heads} * dk, "num_k_heads * dk"); }
  int value_dim() const { return checked_width(int64_t{num_v_heads} * dv, "num_v_heads * dv"); }
  int conv_dim() const { return checked_width(2 * int64_t{key_dim()} + value_dim(), "GDN conv_dim"); }
};

struct AttentionShape {
  int num_heads = 0, num_kv_heads = 0, head_dim = 0;
  bool bias = false;
  bool output_gate = false;  // Qwen3.5: q_proj also yields a sigmoid gate per head
  bool qk_norm = false;      // Qwen3.5: (1+w) RMSNorm of q and k per head
  int rotary_dim = 0;        // 0: no positional encoding (nemotron_h)
  double rope_theta = 10000.0;
  double norm_eps = 1e-6;
  int attention_width() const { return checked_width(int64_t{num_heads} * head_dim, "num_heads * head_dim"); }
  int q_proj_width() const {  // per head: query, then the output gate
    return checked_width(int64_t{attention_width()} * (output_gate ? 2 : 1), "q_proj width");
  }
  int kv_width() const { return checked_width(int64_t{num_kv_heads} * head_dim, "num_kv_heads * head_dim"); }
};

// Kimi Delta Attention (KimiLinearDeltaAttention): num_heads heads of dk = dv = head_dim, each its
// own key head (no sharing); q, k, v of num_heads * head_dim each.
struct KdaShape {
  int num_heads = 0, head_dim = 0;
  int conv_kernel = 4;
  double norm_eps = 1e-5;  // the gated output RMSNorm
  int qkv_dim() const { return checked_width(int64_t{num_heads} * head_dim, "linear_num_heads * linear_head_dim"); }
  int conv_dim() const { return checked_width(3 * int64_t{qkv_dim()}, "KDA conv_dim 3 * linear_num_heads * linear_head_dim"); }
};

// Multi-head latent attention as Kimi Linear computes it (KimiLinearAttention): no positional
// encoding anywhere (the "rope" part of the key is shared by the heads but never rotated).
// Query per head [nope | rope] from q_proj (q_lora_rank 0) or q_b(RMSNorm(q_a x)); latent
// kv_a x = [c (kv_lora_rank) | k_rope]; kv_b(RMSNorm(c)) per head = [k_nope | v].
struct MlaShape {
  int num_heads = 0;
  int q_lora_rank = 0;  // 0: a plain q_proj
  int kv_lora_rank = 0, qk_nope_head_dim = 0, qk_rope_head_dim = 0, v_head_dim = 0;
  bool bias = false;              // q_a_proj, kv_a_proj_with_mqa and o_proj
  double lora_norm_eps = 1e-6;    // q_a_layernorm, kv_a_layernorm (transformers' fixed default)
  int qk_head_dim() const { return checked_width(int64_t{qk_nope_head_dim} + qk_rope_head_dim, "qk_head_dim"); }
  int q_width() const { return checked_width(int64_t{num_heads} * qk_head_dim(), "num_attention_heads * qk_head_dim"); }
  int kv_a_width() const { return checked_width(int64_t{kv_lora_rank} + qk_rope_head_dim, "kv_lora_rank + qk_rope_head_dim"); }
  int kv_b_width() const {
    return checked_width(int64_t{num_heads} * (int64_t{qk_nope_head_dim} + v_head_dim),
                         "num_attention_heads * (qk_nope_head_dim + v_head_dim)");
  }
  int value_width() const { return checked_width(int64_t{num_heads} * v_head_dim, "num_attention_heads * v_head_dim"); }
};

enum class MlpActivation { relu2, swiglu };
struct MlpShape {
  int intermediate_size = 0;
  MlpActivation activation = MlpActivation::relu2;
  bool bias = false;
};

// How a mixture-of-experts layer picks its experts for one token (model/moe.h routes with it).
// From the router logits l = x W^T (one per expert, float32):
//   softmax (Qwen3.5-MoE):  s = softmax(l); choice score c = s
//   sigmoid (DeepSeek-V3 style: Nemotron-H, Kimi Linear): s = sigmoid(l); c = s + e_score_correction_bias
// Grouped selection: the experts are cut into n_group equal groups of consecutive experts; a group
// scores the sum of its two best c; only the topk_group best groups compete (n_group = 1: all).
// The top_k experts by c among them are chosen, weighted by s (not c); with normalise the weights
// are divided by their sum (+ norm_epsilon), then multiplied by scaling.
struct RouterSpec {
  enum class Score { softmax, sigmoid };
  Score score = Score::softmax;
  int n_experts = 0, top_k = 0;
  int n_group = 1, topk_group = 1;
  bool correction_bias = false;  // gate.e_score_correction_bias is read and added to the choice score
  bool normalise = true;
  float norm_epsilon = 0.0f;  // transformers: 1e-20 in the sigmoid routers, none in Qwen3.5-MoE's
  float scaling = 1.0f;       // routed_scaling_factor
};

enum class ExpertActivation { relu2, swiglu };  // down(relu(up x)^2) or down(silu(gate x) * up x)

// A mixture-of-experts layer: routed experts, an optional shared expert and (Nemotron-H) an
// optional latent projection of the experts' input and output.
struct MoeShape {
  RouterSpec router;
  int expert_intermediate = 0;  // moe_intermediate_size
  ExpertActivation activation = ExpertActivation::relu2;
  int shared_intermediate = 0;  // 0: no shared expert
  bool shared_gate = false;     // Qwen3.5-MoE: the shared expert is scaled by sigmoid(shared_expert_gate x)
  bool shared_bias = false;     // Nemotron-H: mlp_bias
  int latent_size = 0;          // Nemotron-H moe_latent_size (0: experts work on the hidden state)
  bool latent_bias = false;
  std::string shared_name = "shared_experts";  // tensor prefix of the shared expert
  // Per-expert tensor names on disk, experts.{e}.NAME.weight: gate_proj / up_proj / down_proj, or
  // Kimi Linear's published w1 (gate) / w3 (up) / w2 (down).
  std::string expert_gate_name = "gate_proj", expert_up_name = "up_proj", expert_down_name = "down_proj";
};

struct ModelConfig {
  std::string source;      // path of config.json
  std::string model_type;  // as written in the file
  Architecture arch = Architecture::mamba2;
  int vocab_size = 0, hidden_size = 0;
  double norm_eps = 1e-5;
  bool norm_plus_one = false;  // RMSNorm scales by (1 + weight) (Qwen3.5)
  bool tie_word_embeddings = false;
  std::vector<LayerKind> layers;  // one per block / decoder layer
  bool layer_has_mlp = false;     // qwen3_5, kimi_linear: every decoder layer ends with an MLP sub-block
  bool mlp_is_moe = false;        // qwen3_5_moe: that MLP sub-block is a mixture of experts (moe)
  std::vector<int> moe_mlp_layers;  // kimi_linear: the decoder layers whose MLP is a mixture of experts
  Mamba2Shape mamba;
  GdnShape gdn;
  AttentionShape attention;
  MlpShape mlp;
  MoeShape moe;  // 'E' layers (nemotron_h), every MLP sub-block (qwen3_5_moe), the sparse ones (kimi_linear)
  KdaShape kda;
  MlaShape mla;

  // Reads MODEL_DIR/config.json. Throws std::runtime_error naming the file, the key and what was
  // expected for a missing or ill-typed key, an unknown model_type, an unsupported layer type, a
  // structural integer that is not positive or too large, head counts that do not divide, a width
  // beyond kMaxWidth, a float field that is NaN, infinite or out of its range, or layer lists that
  // disagree with the counts describing them.
  static ModelConfig load(const std::string& model_dir);
  static ModelConfig from_json_file(const std::string& config_path);

  std::string pattern() const;  // one character per layer (pattern_char)
  int ssm_layer_count() const;
  int attention_layer_count() const;
  int moe_layer_count() const;  // 'E' blocks plus MoE MLP sub-blocks
  bool layer_mlp_is_moe(int layer) const;  // that decoder layer's MLP sub-block is a mixture of experts
};

}  // namespace replayssm::model
