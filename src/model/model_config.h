// Model configuration read from a Hugging Face config.json, for the architectures the loader
// supports (transformers 5.x modelling code is the definition followed):
//   mamba2         Mamba2ForCausalLM             every block: RMSNorm -> Mamba-2 mixer
//   nemotron_h     NemotronHForCausalLM          blocks by pattern: M Mamba-2, * attention, - MLP
//                                                (E = MoE: refused, "not supported yet")
//   qwen3_5_text   Qwen3_5ForCausalLM            decoder layers: Gated DeltaNet or gated attention,
//   (qwen3_5: its text_config)                   each followed by a SwiGLU MLP; (1+w) RMSNorms
#pragma once
#include <string>
#include <vector>

namespace replayssm::model {

enum class Architecture { mamba2, nemotron_h, qwen3_5 };
std::string to_string(Architecture a);

// What mixes tokens (or not) in one block.
enum class LayerKind { mamba2, gated_deltanet, attention, mlp };
char pattern_char(LayerKind k);      // M, G, *, -
std::string to_string(LayerKind k);  // "mamba2", ...

struct Mamba2Shape {
  int num_heads = 0, head_dim = 0;   // value heads and dv
  int state_size = 0, n_groups = 0;  // dk and key heads (B and C are shared by the heads of a group)
  int conv_kernel = 4;
  bool conv_bias = true, proj_bias = false;
  double dt_min = 0.0, dt_max = 0.0;  // clamp of softplus(dt + dt_bias) (dt_max may be +inf)
  int norm_group_size = 0;            // gated RMSNorm groups (mamba2: whole width; nemotron_h: width/n_groups)
  double norm_eps = 1e-5;
  int intermediate() const { return num_heads * head_dim; }
  int conv_dim() const { return intermediate() + 2 * n_groups * state_size; }
};

struct GdnShape {
  int num_k_heads = 0, num_v_heads = 0, dk = 0, dv = 0;
  int conv_kernel = 4;
  double norm_eps = 1e-6;
  int key_dim() const { return num_k_heads * dk; }
  int value_dim() const { return num_v_heads * dv; }
  int conv_dim() const { return 2 * key_dim() + value_dim(); }
};

struct AttentionShape {
  int num_heads = 0, num_kv_heads = 0, head_dim = 0;
  bool bias = false;
  bool output_gate = false;  // Qwen3.5: q_proj also yields a sigmoid gate per head
  bool qk_norm = false;      // Qwen3.5: (1+w) RMSNorm of q and k per head
  int rotary_dim = 0;        // 0: no positional encoding (nemotron_h)
  double rope_theta = 10000.0;
  double norm_eps = 1e-6;
};

enum class MlpActivation { relu2, swiglu };
struct MlpShape {
  int intermediate_size = 0;
  MlpActivation activation = MlpActivation::relu2;
  bool bias = false;
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
  bool layer_has_mlp = false;     // qwen3_5: every decoder layer ends with an MLP sub-block
  Mamba2Shape mamba;
  GdnShape gdn;
  AttentionShape attention;
  MlpShape mlp;

  // Reads MODEL_DIR/config.json. Throws std::runtime_error naming the file and the key for a
  // missing or ill-typed key, an unknown model_type, an unsupported layer (MoE) or inconsistent shapes.
  static ModelConfig load(const std::string& model_dir);
  static ModelConfig from_json_file(const std::string& config_path);

  std::string pattern() const;  // one character per layer (pattern_char)
  int ssm_layer_count() const;
  int attention_layer_count() const;
};

}  // namespace replayssm::model
