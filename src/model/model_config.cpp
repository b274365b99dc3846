#include "model/model_config.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>
#include <optional>
#include <stdexcept>

#include <fmt/format.h>

#include "model/json_util.h"

namespace replayssm::model {

int checked_width(int64_t width, const char* formula) {
  if (width < 0 || width > kMaxWidth)
    throw std::length_error(fmt::format("{} = {} exceeds {} (or is negative): not a supported layer width", formula,
                                        width, kMaxWidth));
  return static_cast<int>(width);
}

namespace {

[[noreturn]] void fail(const JsonObject& j, const std::string& what) {
  throw std::runtime_error(fmt::format("{}: {}", j.where(), what));
}

// ---- integers ----

int64_t bounded_positive(const JsonObject& j, const std::string& key, int64_t max) {
  const int64_t v = j.get_int(key);
  if (v <= 0 || v > max)
    fail(j, fmt::format("config key \"{}\" is {}, expected a positive integer no larger than {}", key, v, max));
  return v;
}
int positive(const JsonObject& j, const std::string& key) {
  return static_cast<int>(bounded_positive(j, key, kMaxWidth));
}
int positive(const JsonObject& j, const std::string& key, int dflt) { return j.has(key) ? positive(j, key) : dflt; }
int layer_count(const JsonObject& j, const std::string& key) {
  return static_cast<int>(bounded_positive(j, key, kMaxLayers));
}

// First present key among aliases (transformers' legacy spellings), else the first one.
std::string present_alias(const JsonObject& j, std::initializer_list<const char*> keys) {
  for (const char* k : keys)
    if (j.has(k)) return k;
  return *keys.begin();
}

// `divisor_key` must divide `multiple_key` (head groups: each group serves the same number of heads).
void check_divides(const JsonObject& j, const std::string& divisor_key, int divisor, const std::string& multiple_key,
                   int multiple, const char* why) {
  if (multiple % divisor != 0)
    fail(j, fmt::format("config key \"{}\" is {}, expected a divisor of {} = {} ({})", divisor_key, divisor,
                        multiple_key, multiple, why));
}

// A layer width derived from config fields, computed in 64 bits from fields <= kMaxWidth.
void check_width(const JsonObject& j, const std::string& formula, int64_t width) {
  if (width > kMaxWidth)
    fail(j, fmt::format("{} = {} exceeds {}, the widest layer supported", formula, width, kMaxWidth));
}

// ---- floats (every one the forward pass reads) ----

constexpr double kFloatMax = std::numeric_limits<float>::max();
constexpr double kFloatMin = std::numeric_limits<float>::min();  // smallest normal float32

double number_in(const JsonObject& j, const std::string& key, double dflt, bool (*ok)(double),
                 const std::string& expected) {
  const double v = j.get_double(key, dflt);
  if (!ok(v)) fail(j, fmt::format("config key \"{}\" is {}, expected {}", key, v, expected));
  return v;
}

// An RMSNorm epsilon (models use 1e-5 .. 1e-6). Zero, negative or NaN makes outputs NaN; a large
// or infinite one flattens every activation, which reads as a perfect KL of 0.
double epsilon(const JsonObject& j, const std::string& key, double dflt) {
  return number_in(
      j, key, dflt, [](double v) { return v >= kFloatMin && v <= 1.0; },
      fmt::format("a finite number in [{}, 1] (an RMSNorm epsilon)", static_cast<float>(kFloatMin)));
}

double rope_theta(const JsonObject& j, const std::string& key, double dflt) {
  return number_in(
      j, key, dflt, [](double v) { return v > 1.0 && v <= kFloatMax; },
      fmt::format("a finite number in (1, {}] (the RoPE base)", static_cast<float>(kFloatMax)));
}

double rotary_fraction(const JsonObject& j, const std::string& key, double dflt) {
  return number_in(
      j, key, dflt, [](double v) { return v > 0.0 && v <= 1.0; }, "a number in (0, 1]");
}

// A lower clamp of dt (applied in float32).
double dt_floor(const JsonObject& j, const std::string& key, double dflt) {
  return number_in(
      j, key, dflt, [](double v) { return v >= 0.0 && v <= kFloatMax; },
      fmt::format("a finite number in [0, {}]", static_cast<float>(kFloatMax)));
}

// ---- shared shape checks ----

// Key names of the Mamba-2 fields (Mamba2 and Nemotron-H spell them differently).
struct Mamba2Keys {
  std::string heads, head_dim, state, groups;
};

void check_mamba2(const JsonObject& j, const Mamba2Shape& m, const Mamba2Keys& k) {
  check_divides(j, k.groups, m.n_groups, k.heads, m.num_heads, "the heads of a group share B and C");
  const int64_t inter = int64_t{m.num_heads} * m.head_dim, bc = 2 * int64_t{m.n_groups} * m.state_size;
  check_width(j, fmt::format("{} * {}", k.heads, k.head_dim), inter);
  check_width(j, fmt::format("2 * {} * {}", k.groups, k.state), bc);
  check_width(j, fmt::format("in_proj width 2 * {} * {} + 2 * {} * {} + {}", k.heads, k.head_dim, k.groups, k.state, k.heads),
              2 * inter + bc + m.num_heads);
}

void check_attention(const JsonObject& j, const AttentionShape& a, const std::string& head_dim_key) {
  check_divides(j, "num_key_value_heads", a.num_kv_heads, "num_attention_heads", a.num_heads,
                "query heads are shared out evenly over key/value heads");
  const int64_t width = int64_t{a.num_heads} * a.head_dim;
  check_width(j, fmt::format("num_attention_heads * {}", head_dim_key), width);
  if (a.output_gate) check_width(j, fmt::format("2 * num_attention_heads * {}", head_dim_key), 2 * width);
  check_width(j, fmt::format("num_key_value_heads * {}", head_dim_key), int64_t{a.num_kv_heads} * a.head_dim);
}

// ---- architectures ----

void load_mamba2(ModelConfig& c, const JsonObject& j) {
  c.vocab_size = positive(j, "vocab_size");
  c.hidden_size = positive(j, "hidden_size");
  c.layers.assign(layer_count(j, "num_hidden_layers"), LayerKind::mamba2);
  c.norm_eps = epsilon(j, "layer_norm_epsilon", 1e-5);
  c.tie_word_embeddings = j.get_bool("tie_word_embeddings", false);
  auto& m = c.mamba;
  m.num_heads = positive(j, "num_heads");
  m.head_dim = positive(j, "head_dim");
  m.state_size = positive(j, "state_size");
  m.n_groups = positive(j, "n_groups", 8);
  m.conv_kernel = positive(j, "conv_kernel", 4);
  m.conv_bias = j.get_bool("use_conv_bias", true);
  m.proj_bias = j.get_bool("use_bias", false);
  m.norm_eps = c.norm_eps;
  const int expand = positive(j, "expand", 2);
  if (static_cast<int64_t>(c.hidden_size) * expand != static_cast<int64_t>(m.num_heads) * m.head_dim)
    fail(j, fmt::format("hidden_size * expand = {} * {} must equal num_heads * head_dim = {} * {}", c.hidden_size,
                        expand, m.num_heads, m.head_dim));
  check_mamba2(j, m, {"num_heads", "head_dim", "state_size", "n_groups"});
  if (j.has("time_step_limit")) {
    const auto lim = j.get_double_list("time_step_limit");
    // dt = clamp(softplus(.), min, max) in float32; softplus >= 0, so min < 0 is meaningless and
    // max = 0 would zero every update. max = Infinity is transformers' "no upper clamp".
    const bool ok = lim.size() == 2 && lim[0] >= 0.0 && lim[0] <= kFloatMax && lim[1] > 0.0 && lim[1] >= lim[0] &&
                    (lim[1] <= kFloatMax || std::isinf(lim[1]));
    if (!ok)
      fail(j, fmt::format("config key \"time_step_limit\" is {}, expected [min, max] with 0 <= min <= max, max > 0, "
                          "min finite and max finite or Infinity (float32 range)",
                          j.json()["time_step_limit"].dump()));
    m.dt_min = lim[0];
    m.dt_max = lim[1];
  } else {
    m.dt_min = 0.0;
    m.dt_max = std::numeric_limits<double>::infinity();
  }
  // transformers' Mamba2 gated RMSNorm normalises over the whole intermediate width.
  m.norm_group_size = m.intermediate();
  const std::string act = j.get_string("hidden_act", "silu");
  if (act != "silu" && act != "swish")
    fail(j, fmt::format("hidden_act \"{}\" is not supported (expected \"silu\")", printable(act)));
}

// Nemotron-H layer types as written in layers_block_type (aliases normalised), or from the legacy
// hybrid_override_pattern string.
std::string normalised_block_type(const std::string& t) {
  if (t == "mamba") return "linear_attention";
  if (t == "attention") return "full_attention";
  return t;
}
char block_type_char(const std::string& t) {
  if (t == "linear_attention") return 'M';
  if (t == "full_attention") return '*';
  if (t == "mlp") return '-';
  if (t == "moe") return 'E';
  return '?';
}
std::vector<std::string> types_from_pattern(const JsonObject& j, const std::string& p) {
  if (static_cast<int64_t>(p.size()) > kMaxLayers)
    fail(j, fmt::format("config key \"hybrid_override_pattern\" has {} layers, expected at most {}", p.size(),
                        kMaxLayers));
  std::vector<std::string> types;
  for (std::size_t i = 0; i < p.size(); ++i) {
    switch (p[i]) {
      case 'M':
        types.push_back("linear_attention");
        break;
      case '*':
        types.push_back("full_attention");
        break;
      case '-':
        types.push_back("mlp");
        break;
      case 'E':
        types.push_back("moe");
        break;
      default:
        fail(j, fmt::format("hybrid_override_pattern \"{}\": character '{}' at layer {} is not one of M * - E",
                            printable(p), printable(std::string(1, p[i])), i));
    }
  }
  return types;
}

// ---- mixture of experts ----

// The routing fields every router reads, checked against each other: top_k <= n_experts, n_group
// divides the experts, topk_group <= n_group, and the chosen groups hold top_k experts at least.
// Sigmoid routers score a group by its two best experts, so a group needs two.
void check_router(const JsonObject& j, const RouterSpec& r, const std::string& experts_key,
                  const std::string& top_k_key = "num_experts_per_tok", const std::string& group_key = "n_group") {
  if (r.top_k > r.n_experts)
    fail(j, fmt::format("config key \"{}\" is {}, expected at most {} = {} (each token picks distinct experts)",
                        top_k_key, r.top_k, experts_key, r.n_experts));
  if (r.n_experts % r.n_group != 0)
    fail(j, fmt::format("config key \"{}\" is {}, expected a divisor of {} = {} (experts are cut into equal "
                        "groups)",
                        group_key, r.n_group, experts_key, r.n_experts));
  if (r.topk_group > r.n_group)
    fail(j, fmt::format("config key \"topk_group\" is {}, expected at most {} = {}", r.topk_group, group_key,
                        r.n_group));
  const int per_group = r.n_experts / r.n_group;
  if (r.score == RouterSpec::Score::sigmoid && per_group < 2)
    fail(j, fmt::format("{} / {} = {} / {} leaves {} expert per group, expected at least 2 (a group is scored by "
                        "its two best experts)",
                        experts_key, group_key, r.n_experts, r.n_group, per_group));
  if (int64_t{r.topk_group} * per_group < r.top_k)
    fail(j, fmt::format("topk_group * ({} / {}) = {} * {} experts compete, expected at least {} = {}", experts_key,
                        group_key, r.topk_group, per_group, top_k_key, r.top_k));
}

// A routed-weight factor: finite and positive (0 would silence every expert, a negative one flip them).
float routed_scaling(const JsonObject& j, const std::string& key, double dflt) {
  return static_cast<float>(number_in(
      j, key, dflt, [](double v) { return v > 0.0 && v <= 1e6; }, "a finite number in (0, 1e6]"));
}

// NemotronHMoE (transformers 5.17): sigmoid router with e_score_correction_bias and grouped
// selection, relu2 experts (up/down, no bias), a shared relu2 MLP, optional latent projection.
void load_nemotron_h_moe(ModelConfig& c, const JsonObject& j) {
  MoeShape& e = c.moe;
  RouterSpec& r = e.router;
  const std::string experts_key = present_alias(j, {"n_routed_experts", "num_local_experts"});
  r.score = RouterSpec::Score::sigmoid;
  r.n_experts = positive(j, experts_key, 8);
  r.top_k = positive(j, "num_experts_per_tok", 2);
  r.n_group = positive(j, "n_group", 1);
  r.topk_group = positive(j, "topk_group", 1);
  r.correction_bias = true;
  r.normalise = j.get_bool("norm_topk_prob", true);
  r.norm_epsilon = 1e-20f;
  r.scaling = routed_scaling(j, "routed_scaling_factor", 1.0);
  check_router(j, r, experts_key);
  e.expert_intermediate = positive(j, "moe_intermediate_size", 7688);
  e.activation = ExpertActivation::relu2;
  e.shared_intermediate = positive(j, "moe_shared_expert_intermediate_size", 7688);
  e.shared_bias = j.get_bool("mlp_bias", false);
  e.shared_name = "shared_experts";
  e.latent_size = j.has("moe_latent_size") ? positive(j, "moe_latent_size") : 0;
  e.latent_bias = e.shared_bias;
  const std::string act = j.get_string("mlp_hidden_act", "relu2");
  if (act != "relu2") fail(j, fmt::format("mlp_hidden_act \"{}\" is not supported (expected \"relu2\")", printable(act)));
}

void load_nemotron_h(ModelConfig& c, const JsonObject& j) {
  c.vocab_size = positive(j, "vocab_size");
  c.hidden_size = positive(j, "hidden_size");
  c.norm_eps = epsilon(j, "layer_norm_epsilon", 1e-5);
  c.tie_word_embeddings = j.get_bool("tie_word_embeddings", false);
  std::vector<std::string> types;
  std::string pattern_key;
  if (j.has("layers_block_type")) {
    pattern_key = "layers_block_type";
    for (const std::string& t : j.get_string_list("layers_block_type")) types.push_back(normalised_block_type(t));
    if (static_cast<int64_t>(types.size()) > kMaxLayers)
      fail(j, fmt::format("config key \"layers_block_type\" has {} layers, expected at most {}", types.size(),
                          kMaxLayers));
    // Both spellings present: they must describe the same layers.
    if (j.has("hybrid_override_pattern")) {
      const std::string legacy = j.get_string("hybrid_override_pattern");
      if (types_from_pattern(j, legacy) != types) {
        std::string pattern;
        for (const auto& t : types) pattern += block_type_char(t);
        fail(j, fmt::format("config key \"hybrid_override_pattern\" is \"{}\", which disagrees with layers_block_type "
                            "(\"{}\"): expected one of the two, or the same layers",
                            printable(legacy), pattern));
      }
    }
  } else if (j.has("hybrid_override_pattern")) {
    pattern_key = "hybrid_override_pattern";
    types = types_from_pattern(j, j.get_string("hybrid_override_pattern"));
  } else {
    fail(j, "missing config key \"layers_block_type\" (or the legacy \"hybrid_override_pattern\")");
  }
  if (types.empty()) fail(j, "the layer pattern is empty");
  // transformers derives num_hidden_layers from the pattern; a different one written beside it is a contradiction.
  if (j.has("num_hidden_layers") && j.get_int("num_hidden_layers") != static_cast<int64_t>(types.size()))
    fail(j, fmt::format("config key \"num_hidden_layers\" is {}, expected {} (the length of {})",
                        j.get_int("num_hidden_layers"), types.size(), pattern_key));
  for (std::size_t i = 0; i < types.size(); ++i) {
    const std::string& t = types[i];
    if (t == "linear_attention")
      c.layers.push_back(LayerKind::mamba2);
    else if (t == "full_attention")
      c.layers.push_back(LayerKind::attention);
    else if (t == "mlp")
      c.layers.push_back(LayerKind::mlp);
    else if (t == "moe")
      c.layers.push_back(LayerKind::moe);
    else
      fail(j, fmt::format("layer {} has type \"{}\", expected linear_attention, full_attention, mlp (or moe)", i,
                          printable(t)));
  }
  auto& m = c.mamba;
  if (c.ssm_layer_count() > 0) {
    const std::string groups_key = present_alias(j, {"mamba_n_groups", "n_groups"});
    const std::string conv_key = present_alias(j, {"mamba_d_conv", "conv_kernel"});
    const std::string conv_bias_key = present_alias(j, {"mamba_conv_bias", "use_conv_bias"});
    const std::string dt_min_key = present_alias(j, {"mamba_dt_min", "time_step_min"});
    m.num_heads = positive(j, "mamba_num_heads");
    m.head_dim = positive(j, "mamba_head_dim");
    m.state_size = positive(j, "ssm_state_size");
    m.n_groups = positive(j, groups_key, 8);
    m.conv_kernel = positive(j, conv_key, 4);
    m.conv_bias = j.get_bool(conv_bias_key, true);
    m.proj_bias = j.get_bool("use_bias", false);
    // NemotronHMamba2Mixer clamps dt to [time_step_min, inf), whatever time_step_limit says.
    m.dt_min = dt_floor(j, dt_min_key, 0.001);
    m.dt_max = std::numeric_limits<double>::infinity();
    m.norm_eps = c.norm_eps;
    check_mamba2(j, m, {"mamba_num_heads", "mamba_head_dim", "ssm_state_size", groups_key});
    m.norm_group_size = m.intermediate() / m.n_groups;
    const std::string act = j.get_string("mamba_hidden_act", "silu");
    if (act != "silu" && act != "swish")
      fail(j, fmt::format("mamba_hidden_act \"{}\" is not supported (expected \"silu\")", printable(act)));
  }
  if (c.attention_layer_count() > 0) {
    auto& a = c.attention;
    const std::string head_dim_key = present_alias(j, {"head_dim", "attention_head_dim"});
    a.num_heads = positive(j, "num_attention_heads");
    a.num_kv_heads = positive(j, "num_key_value_heads", a.num_heads);
    a.head_dim = positive(j, head_dim_key, 128);
    a.bias = false;  // NemotronHAttention has no projection biases
    a.rotary_dim = 0;
    check_attention(j, a, head_dim_key);
  }
  if (std::count(c.layers.begin(), c.layers.end(), LayerKind::mlp) > 0) {
    c.mlp.intermediate_size = positive(j, "intermediate_size");
    c.mlp.bias = j.get_bool("mlp_bias", false);
    const std::string act = j.get_string("mlp_hidden_act", "relu2");
    if (act != "relu2") fail(j, fmt::format("mlp_hidden_act \"{}\" is not supported (expected \"relu2\")", printable(act)));
    c.mlp.activation = MlpActivation::relu2;
  }
  if (c.moe_layer_count() > 0) load_nemotron_h_moe(c, j);
}

// Qwen3_5MoeSparseMoeBlock (transformers 5.17): softmax router, top-k always renormalised, SwiGLU
// experts, a SwiGLU shared expert scaled by sigmoid(shared_expert_gate x); every decoder layer's MLP.
// Keys of other Qwen MoE generations that 5.17 does not read are accepted only where they agree with
// that computation, so a checkpoint meaning something else is refused rather than misread.
void load_qwen3_5_moe_mlp(ModelConfig& c, const JsonObject& j) {
  MoeShape& e = c.moe;
  RouterSpec& r = e.router;
  r.score = RouterSpec::Score::softmax;
  r.n_experts = positive(j, "num_experts");
  r.top_k = positive(j, "num_experts_per_tok");
  r.n_group = r.topk_group = 1;
  r.correction_bias = false;
  r.normalise = true;
  r.norm_epsilon = 0.0f;
  r.scaling = 1.0f;
  check_router(j, r, "num_experts");
  if (j.has("norm_topk_prob") && !j.get_bool("norm_topk_prob"))
    fail(j, "config key \"norm_topk_prob\" is false, but Qwen3.5-MoE (transformers 5.17) always renormalises the "
            "top-k weights: expected true or absent");
  if (j.has("decoder_sparse_step") && j.get_int("decoder_sparse_step") != 1)
    fail(j, fmt::format("config key \"decoder_sparse_step\" is {}, but every Qwen3.5-MoE layer is sparse "
                        "(transformers 5.17): expected 1 or absent",
                        j.get_int("decoder_sparse_step")));
  if (j.has("mlp_only_layers") && !j.json()["mlp_only_layers"].empty())
    fail(j, fmt::format("config key \"mlp_only_layers\" is {}, but every Qwen3.5-MoE layer is sparse (transformers "
                        "5.17): expected [] or absent",
                        j.json()["mlp_only_layers"].dump()));
  e.expert_intermediate = positive(j, "moe_intermediate_size");
  e.activation = ExpertActivation::swiglu;
  e.shared_intermediate = positive(j, "shared_expert_intermediate_size");
  e.shared_gate = true;
  e.shared_bias = false;
  e.shared_name = "shared_expert";
}

void load_qwen3_5_text(ModelConfig& c, const JsonObject& j, const JsonObject* outer) {
  c.vocab_size = positive(j, "vocab_size");
  c.hidden_size = positive(j, "hidden_size");
  const int n_layers = layer_count(j, "num_hidden_layers");
  c.norm_eps = epsilon(j, "rms_norm_eps", 1e-6);
  c.norm_plus_one = true;
  c.layer_has_mlp = true;
  // Multimodal configs may write the flag outside text_config; two different values are a contradiction.
  const bool inner_tie = j.has("tie_word_embeddings"), outer_tie = outer && outer->has("tie_word_embeddings");
  if (inner_tie && outer_tie && j.get_bool("tie_word_embeddings") != outer->get_bool("tie_word_embeddings"))
    fail(*outer, fmt::format("config key \"tie_word_embeddings\" is {}, but text_config says {} (expected one value)",
                             outer->get_bool("tie_word_embeddings"), j.get_bool("tie_word_embeddings")));
  c.tie_word_embeddings = inner_tie   ? j.get_bool("tie_word_embeddings")
                          : outer_tie ? outer->get_bool("tie_word_embeddings")
                                      : false;
  std::vector<std::string> types;
  if (j.has("layer_types")) {
    types = j.get_string_list("layer_types");
    if (static_cast<int>(types.size()) != n_layers)
      fail(j, fmt::format("layer_types has {} entries, expected num_hidden_layers = {}", types.size(), n_layers));
  } else {
    const int interval = positive(j, "full_attention_interval", 4);
    for (int i = 0; i < n_layers; ++i) types.push_back((i + 1) % interval ? "linear_attention" : "full_attention");
  }
  for (std::size_t i = 0; i < types.size(); ++i) {
    if (types[i] == "linear_attention")
      c.layers.push_back(LayerKind::gated_deltanet);
    else if (types[i] == "full_attention" || types[i] == "attention")
      c.layers.push_back(LayerKind::attention);
    else
      fail(j, fmt::format("layer_types[{}] is \"{}\", expected \"linear_attention\" or \"full_attention\"", i,
                          printable(types[i])));
  }
  const std::string act = j.get_string("hidden_act", "silu");
  if (act != "silu" && act != "swish")
    fail(j, fmt::format("hidden_act \"{}\" is not supported (expected \"silu\")", printable(act)));
  if (c.mlp_is_moe) {
    load_qwen3_5_moe_mlp(c, j);
  } else {
    c.mlp.intermediate_size = positive(j, "intermediate_size");
    c.mlp.activation = MlpActivation::swiglu;
    c.mlp.bias = false;
  }

  auto& g = c.gdn;
  g.num_k_heads = positive(j, "linear_num_key_heads", 16);
  g.num_v_heads = positive(j, "linear_num_value_heads", 32);
  g.dk = positive(j, "linear_key_head_dim", 128);
  g.dv = positive(j, "linear_value_head_dim", 128);
  g.conv_kernel = positive(j, "linear_conv_kernel_dim", 4);
  g.norm_eps = c.norm_eps;
  check_divides(j, "linear_num_key_heads", g.num_k_heads, "linear_num_value_heads", g.num_v_heads,
                "value heads are shared out evenly over key heads");
  const int64_t key_dim = int64_t{g.num_k_heads} * g.dk, value_dim = int64_t{g.num_v_heads} * g.dv;
  check_width(j, "linear_num_key_heads * linear_key_head_dim", key_dim);
  check_width(j, "linear_num_value_heads * linear_value_head_dim", value_dim);
  check_width(j,
              "in_proj_qkv width 2 * linear_num_key_heads * linear_key_head_dim + linear_num_value_heads * "
              "linear_value_head_dim",
              2 * key_dim + value_dim);

  auto& a = c.attention;
  a.num_heads = positive(j, "num_attention_heads");
  a.num_kv_heads = positive(j, "num_key_value_heads");
  a.head_dim = positive(j, "head_dim", 256);  // Qwen3_5TextConfig default
  a.bias = j.get_bool("attention_bias", false);
  a.output_gate = true;
  a.qk_norm = true;
  a.norm_eps = c.norm_eps;
  check_attention(j, a, "head_dim");
  // RoPE parameters: rope_parameters (or legacy rope_scaling) first, then top-level keys
  // (transformers' standardisation order); partial_rotary_factor defaults to 0.25 for Qwen3.5.
  double theta = rope_theta(j, "rope_theta", 10000.0);
  double partial = rotary_fraction(j, "partial_rotary_factor", 0.25);
  std::string rope_type = "default";
  for (const char* key : {"rope_parameters", "rope_scaling"}) {
    if (!j.has(key)) continue;
    const JsonObject rp = j.get_object(key);
    theta = rope_theta(rp, "rope_theta", theta);
    partial = rotary_fraction(rp, "partial_rotary_factor", partial);
    rope_type = rp.has("rope_type") ? rp.get_string("rope_type") : rp.get_string("type", "default");
    break;
  }
  if (rope_type != "default")
    fail(j,
         fmt::format("rope_type \"{}\" is not supported (expected \"default\"; text positions make M-RoPE plain RoPE)",
                     printable(rope_type)));
  // As transformers: int(head_dim * partial_rotary_factor); rotate_half needs an even count.
  a.rotary_dim = static_cast<int>(a.head_dim * partial);
  if (a.rotary_dim < 2 || a.rotary_dim % 2 != 0)
    fail(j, fmt::format("head_dim * partial_rotary_factor = {} * {} gives {} rotary dimensions, expected an even "
                        "number of at least 2",
                        a.head_dim, partial, a.rotary_dim));
  a.rope_theta = theta;
}


// ---- Kimi Linear ----

// A list of layer numbers (linear_attn_config's 1-based full_attn_layers / kda_layers).
std::vector<int64_t> layer_numbers(const JsonObject& j, const std::string& key) {
  const nlohmann::json& v = j.json()[key];
  if (!v.is_array()) fail(j, fmt::format("config key \"{}\" must be a list of layer numbers", key));
  std::vector<int64_t> out;
  for (std::size_t i = 0; i < v.size(); ++i) {
    if (!v[i].is_number_integer())
      fail(j, fmt::format("config key \"{}\"[{}] is {}, expected an integer layer number", key, i, v[i].dump()));
    out.push_back(v[i].get<int64_t>());
  }
  return out;
}

// Layer types from linear_attn_config (1-based numbers, transformers' checkpoint convention): every
// layer must be named exactly once, in one of the two lists.
std::vector<std::string> types_from_linear_attn_config(const JsonObject& lac, int n_layers) {
  std::vector<std::string> types(n_layers);
  for (const auto& [key, type] : {std::pair<const char*, const char*>{"full_attn_layers", "full_attention"},
                                  {"kda_layers", "linear_attention"}}) {
    for (int64_t l : layer_numbers(lac, key)) {
      if (l < 1 || l > n_layers)
        fail(lac, fmt::format("config key \"{}\" names layer {}, expected a layer number in [1, {}] "
                              "(1-based, num_hidden_layers = {})",
                              key, l, n_layers, n_layers));
      if (!types[l - 1].empty())
        fail(lac, fmt::format("config key \"{}\" names layer {} again, expected each layer in exactly one of "
                              "full_attn_layers and kda_layers once",
                              key, l));
      types[l - 1] = type;
    }
  }
  for (int i = 0; i < n_layers; ++i)
    if (types[i].empty())
      fail(lac, fmt::format("layer {} (1-based) is in neither full_attn_layers nor kda_layers, expected each of the "
                            "{} layers in exactly one",
                            i + 1, n_layers));
  return types;
}

// A KDA field written at the top level (transformers' spelling) and/or in linear_attn_config (the
// checkpoints' spelling, which transformers reads first): two different values are a contradiction.
int kda_field(const JsonObject& j, const JsonObject* lac, const std::string& key, const std::string& lac_key,
              int dflt) {
  const bool top = j.has(key), inner = lac && lac->has(lac_key);
  if (top && inner && positive(j, key) != positive(*lac, lac_key))
    fail(j, fmt::format("config key \"{}\" is {}, but linear_attn_config.{} is {} (expected one value)", key,
                        positive(j, key), lac_key, positive(*lac, lac_key)));
  return inner ? positive(*lac, lac_key) : positive(j, key, dflt);
}

// The key of a KimiLinearConfig field that has two spellings: the one transformers writes (and the
// published checkpoints use) or its attribute alias. Both present with different values: refused.
std::string kimi_spelling(const JsonObject& j, const std::string& written, const std::string& alias) {
  if (!j.has(alias)) return written;
  if (!j.has(written)) return alias;
  const nlohmann::json &a = j.json()[written], &b = j.json()[alias];
  if (a != b)
    fail(j, fmt::format("config keys \"{}\" ({}) and \"{}\" ({}) name the same field (expected one value)", written,
                        a.dump(), alias, b.dump()));
  return written;
}

// KimiLinearMoE (transformers 5.17): Nemotron-H's sigmoid router (correction bias for the choice
// only, grouped top-k, weights from the unbiased scores renormalised + 1e-20 when moe_renormalize,
// times routed_scaling_factor), SwiGLU experts, and num_shared_experts shared experts computed as
// one SwiGLU MLP of moe_intermediate_size * num_shared_experts. Defaults are KimiLinearConfig's.
void load_kimi_linear_moe(ModelConfig& c, const JsonObject& j) {
  MoeShape& e = c.moe;
  RouterSpec& r = e.router;
  const std::string experts_key = kimi_spelling(j, "num_experts", "num_local_experts");
  const std::string top_k_key = kimi_spelling(j, "num_experts_per_token", "num_experts_per_tok");
  const std::string group_key = kimi_spelling(j, "num_expert_group", "n_group");
  const std::string shared_key = kimi_spelling(j, "num_shared_experts", "n_shared_experts");
  const std::string renorm_key = kimi_spelling(j, "moe_renormalize", "norm_topk_prob");
  // Written as null, transformers cannot route (topk of None): not a default.
  for (const std::string& key : {top_k_key, std::string("topk_group")})
    if (j.json().contains(key) && j.json()[key].is_null())
      fail(j, fmt::format("config key \"{}\" is null, expected a positive integer", key));
  r.score = RouterSpec::Score::sigmoid;
  r.n_experts = positive(j, experts_key, 256);
  r.top_k = positive(j, top_k_key, 8);
  r.n_group = positive(j, group_key, 1);
  r.topk_group = positive(j, "topk_group", 1);
  r.correction_bias = true;
  r.normalise = j.get_bool(renorm_key, true);
  r.norm_epsilon = 1e-20f;
  r.scaling = routed_scaling(j, "routed_scaling_factor", 2.446);
  check_router(j, r, experts_key, top_k_key, group_key);
  e.expert_intermediate = positive(j, "moe_intermediate_size", 1024);
  e.activation = ExpertActivation::swiglu;
  const int n_shared = positive(j, shared_key, 1);
  const int64_t shared = int64_t{e.expert_intermediate} * n_shared;
  check_width(j, fmt::format("moe_intermediate_size * {}", shared_key), shared);
  e.shared_intermediate = static_cast<int>(shared);
  e.shared_gate = false;
  e.shared_bias = false;
  e.shared_name = "shared_experts";
  e.expert_gate_name = "w1";
  e.expert_up_name = "w3";
  e.expert_down_name = "w2";
  // Keys of the published remote-code config that transformers 5.17 ignores: accepted only where
  // they agree with its computation, so a checkpoint meaning something else is not misread.
  if (j.has("moe_layer_freq") && j.json()["moe_layer_freq"] != 1)
    fail(j, fmt::format("config key \"moe_layer_freq\" is {}, but transformers 5.17 makes every layer from "
                        "first_k_dense_replace on sparse: expected 1 or absent (or mlp_layer_types)",
                        j.json()["moe_layer_freq"].dump()));
  if (j.has("moe_router_activation_func") && j.json()["moe_router_activation_func"] != "sigmoid")
    fail(j, fmt::format("config key \"moe_router_activation_func\" is {}, but Kimi Linear's router (transformers "
                        "5.17) scores by sigmoid: expected \"sigmoid\" or absent",
                        j.json()["moe_router_activation_func"].dump()));
}

void load_kimi_linear(ModelConfig& c, const JsonObject& j) {
  c.vocab_size = positive(j, "vocab_size");
  c.hidden_size = positive(j, "hidden_size");
  const int n_layers = layer_count(j, "num_hidden_layers");
  c.norm_eps = epsilon(j, "rms_norm_eps", 1e-5);
  c.tie_word_embeddings = j.get_bool("tie_word_embeddings", false);
  c.layer_has_mlp = true;
  const std::string act = j.get_string("hidden_act", "silu");  // the short convolutions and the MLPs
  if (act != "silu" && act != "swish")
    fail(j, fmt::format("hidden_act \"{}\" is not supported (expected \"silu\")", printable(act)));
  std::optional<JsonObject> lac;
  if (j.has("linear_attn_config")) lac = j.get_object("linear_attn_config");

  // Token mixers: layer_types, else linear_attn_config's lists, else transformers' default (every
  // fourth layer after the first is full attention).
  std::vector<std::string> types;
  std::string types_key = "layer_types";
  if (j.has("layer_types")) {
    types = j.get_string_list("layer_types");
    if (static_cast<int>(types.size()) != n_layers)
      fail(j, fmt::format("layer_types has {} entries, expected num_hidden_layers = {}", types.size(), n_layers));
    // transformers reads layer_types first; linear_attn_config's lists beside it must agree.
    if (lac && lac->has("full_attn_layers") && lac->has("kda_layers") &&
        types_from_linear_attn_config(*lac, n_layers) != types)
      fail(j, "config keys \"layer_types\" and linear_attn_config's full_attn_layers/kda_layers describe different "
              "layers (expected one of the two, or the same layers)");
  } else if (lac && lac->has("full_attn_layers") && lac->has("kda_layers")) {
    types = types_from_linear_attn_config(*lac, n_layers);
    types_key = "linear_attn_config";
  } else {
    for (int i = 0; i < n_layers; ++i) types.push_back(i && i % 4 == 0 ? "full_attention" : "linear_attention");
  }
  for (std::size_t i = 0; i < types.size(); ++i) {
    if (types[i] == "linear_attention")
      c.layers.push_back(LayerKind::kda);
    else if (types[i] == "full_attention")
      c.layers.push_back(LayerKind::mla);
    else
      fail(j, fmt::format("{}[{}] is \"{}\", expected \"linear_attention\" or \"full_attention\"", types_key, i,
                          printable(types[i])));
  }

  // MLP of each decoder layer: mlp_layer_types, else "dense" below first_k_dense_replace (default 1).
  std::vector<std::string> mlp_types, from_first_k;
  const int64_t first_dense = j.get_int("first_k_dense_replace", 1);
  if (first_dense < 0) fail(j, fmt::format("config key \"first_k_dense_replace\" is {}, expected >= 0", first_dense));
  for (int i = 0; i < n_layers; ++i) from_first_k.push_back(i < first_dense ? "dense" : "sparse");
  if (j.has("mlp_layer_types")) {
    mlp_types = j.get_string_list("mlp_layer_types");
    if (static_cast<int>(mlp_types.size()) != n_layers)
      fail(j, fmt::format("mlp_layer_types has {} entries, expected num_hidden_layers = {}", mlp_types.size(),
                          n_layers));
    for (std::size_t i = 0; i < mlp_types.size(); ++i)
      if (mlp_types[i] != "dense" && mlp_types[i] != "sparse")
        fail(j, fmt::format("mlp_layer_types[{}] is \"{}\", expected \"dense\" or \"sparse\"", i,
                            printable(mlp_types[i])));
    if (j.has("first_k_dense_replace") && mlp_types != from_first_k)
      fail(j, fmt::format("config key \"first_k_dense_replace\" is {}, which disagrees with mlp_layer_types (expected "
                          "one of the two, or the same layers)",
                          first_dense));
  } else {
    mlp_types = from_first_k;
  }
  for (int i = 0; i < n_layers; ++i)
    if (mlp_types[i] == "sparse") c.moe_mlp_layers.push_back(i);
  if (!c.moe_mlp_layers.empty()) load_kimi_linear_moe(c, j);
  if (static_cast<int>(c.moe_mlp_layers.size()) < n_layers) {
    c.mlp.intermediate_size = positive(j, "intermediate_size");
    c.mlp.activation = MlpActivation::swiglu;
    c.mlp.bias = false;
  }

  if (std::count(c.layers.begin(), c.layers.end(), LayerKind::kda) > 0) {
    auto& k = c.kda;
    const JsonObject* l = lac ? &*lac : nullptr;
    k.num_heads = kda_field(j, l, "linear_num_heads", "num_heads", 32);
    k.head_dim = kda_field(j, l, "linear_head_dim", "head_dim", 128);
    k.conv_kernel = kda_field(j, l, "linear_conv_kernel_dim", "short_conv_kernel_size", 4);
    k.norm_eps = c.norm_eps;
    const int64_t qkv = int64_t{k.num_heads} * k.head_dim;
    check_width(j, "linear_num_heads * linear_head_dim", qkv);
    check_width(j, "KDA conv width 3 * linear_num_heads * linear_head_dim", 3 * qkv);
  }
  if (std::count(c.layers.begin(), c.layers.end(), LayerKind::mla) > 0) {
    auto& a = c.mla;
    a.num_heads = positive(j, "num_attention_heads");
    // transformers expands kv_b_proj to every query head, then repeats it H / num_key_value_heads
    // times: only num_key_value_heads = num_attention_heads gives matching shapes.
    if (j.has("num_key_value_heads") && j.get_int("num_key_value_heads") != a.num_heads)
      fail(j, fmt::format("config key \"num_key_value_heads\" is {}, expected num_attention_heads = {} (Kimi "
                          "Linear's latent attention has one key/value head per query head)",
                          j.get_int("num_key_value_heads"), a.num_heads));
    a.q_lora_rank = j.has("q_lora_rank") ? positive(j, "q_lora_rank") : 0;
    a.kv_lora_rank = positive(j, "kv_lora_rank");
    a.qk_nope_head_dim = positive(j, "qk_nope_head_dim");
    a.qk_rope_head_dim = positive(j, "qk_rope_head_dim");
    a.v_head_dim = positive(j, "v_head_dim");
    a.bias = j.get_bool("attention_bias", false);
    const int64_t qk = int64_t{a.qk_nope_head_dim} + a.qk_rope_head_dim;
    check_width(j, "qk_nope_head_dim + qk_rope_head_dim", qk);
    check_width(j, "num_attention_heads * (qk_nope_head_dim + qk_rope_head_dim)", a.num_heads * qk);
    check_width(j, "kv_lora_rank + qk_rope_head_dim", int64_t{a.kv_lora_rank} + a.qk_rope_head_dim);
    check_width(j, "num_attention_heads * (qk_nope_head_dim + v_head_dim)",
                int64_t{a.num_heads} * (int64_t{a.qk_nope_head_dim} + a.v_head_dim));
  }
}
}  // namespace

std::string to_string(Architecture a) {
  switch (a) {
    case Architecture::mamba2:
      return "mamba2";
    case Architecture::nemotron_h:
      return "nemotron_h";
    case Architecture::qwen3_5:
      return "qwen3_5";
    case Architecture::kimi_linear:
      return "kimi_linear";
  }
  return "?";
}

char pattern_char(LayerKind k) {
  switch (k) {
    case LayerKind::mamba2:
      return 'M';
    case LayerKind::gated_deltanet:
      return 'G';
    case LayerKind::attention:
      return '*';
    case LayerKind::mlp:
      return '-';
    case LayerKind::moe:
      return 'E';
    case LayerKind::kda:
      return 'K';
    case LayerKind::mla:
      return '*';
  }
  return '?';
}

std::string to_string(LayerKind k) {
  switch (k) {
    case LayerKind::mamba2:
      return "mamba2";
    case LayerKind::gated_deltanet:
      return "gated_deltanet";
    case LayerKind::attention:
      return "attention";
    case LayerKind::mlp:
      return "mlp";
    case LayerKind::moe:
      return "moe";
    case LayerKind::kda:
      return "kda";
    case LayerKind::mla:
      return "mla_attention";
  }
  return "?";
}

std::string ModelConfig::pattern() const {
  std::string p;
  for (LayerKind k : layers) p += pattern_char(k);
  return p;
}

bool is_ssm_layer(LayerKind k) {
  return k == LayerKind::mamba2 || k == LayerKind::gated_deltanet || k == LayerKind::kda;
}

int ModelConfig::ssm_layer_count() const {
  return static_cast<int>(std::count_if(layers.begin(), layers.end(), is_ssm_layer));
}
int ModelConfig::attention_layer_count() const {
  return static_cast<int>(std::count(layers.begin(), layers.end(), LayerKind::attention));
}
int ModelConfig::moe_layer_count() const {
  return static_cast<int>(std::count(layers.begin(), layers.end(), LayerKind::moe)) +
         (mlp_is_moe ? static_cast<int>(layers.size()) : 0) + static_cast<int>(moe_mlp_layers.size());
}
bool ModelConfig::layer_mlp_is_moe(int layer) const {
  return mlp_is_moe || std::find(moe_mlp_layers.begin(), moe_mlp_layers.end(), layer) != moe_mlp_layers.end();
}

ModelConfig ModelConfig::load(const std::string& model_dir) {
  const std::filesystem::path p = std::filesystem::path(model_dir) / "config.json";
  if (!std::filesystem::is_directory(model_dir))
    throw std::runtime_error(
        fmt::format("{}: not a model directory (expected a directory with config.json and "
                    "model.safetensors)",
                    model_dir));
  // A dangling link is not "missing": read_json_file names its target.
  if (!std::filesystem::exists(p) && !std::filesystem::is_symlink(p)) throw std::runtime_error(fmt::format("{}: missing config.json", model_dir));
  return from_json_file(p.string());
}

ModelConfig ModelConfig::from_json_file(const std::string& path) {
  const JsonObject j(read_json_file(path), path);
  ModelConfig c;
  c.source = path;
  c.model_type = j.get_string("model_type");
  if (c.model_type == "mamba2") {
    c.arch = Architecture::mamba2;
    load_mamba2(c, j);
  } else if (c.model_type == "nemotron_h") {
    c.arch = Architecture::nemotron_h;
    load_nemotron_h(c, j);
  } else if (c.model_type == "qwen3_5_text") {
    c.arch = Architecture::qwen3_5;
    load_qwen3_5_text(c, j, nullptr);
  } else if (c.model_type == "qwen3_5") {
    c.arch = Architecture::qwen3_5;
    const JsonObject t = j.get_object("text_config");
    load_qwen3_5_text(c, t, &j);
  } else if (c.model_type == "qwen3_5_moe_text") {
    c.arch = Architecture::qwen3_5;
    c.mlp_is_moe = true;
    load_qwen3_5_text(c, j, nullptr);
  } else if (c.model_type == "qwen3_5_moe") {
    c.arch = Architecture::qwen3_5;
    c.mlp_is_moe = true;
    const JsonObject t = j.get_object("text_config");
    load_qwen3_5_text(c, t, &j);
  } else if (c.model_type == "kimi_linear") {
    c.arch = Architecture::kimi_linear;
    load_kimi_linear(c, j);
  } else if (c.model_type == "qwen3_next") {
    throw std::runtime_error(
        fmt::format("{}: model_type \"{}\" is not supported (supported: mamba2, nemotron_h, qwen3_5, qwen3_5_text, "
                    "qwen3_5_moe, qwen3_5_moe_text, kimi_linear)",
                    path, printable(c.model_type)));
  } else {
    throw std::runtime_error(
        fmt::format("{}: unknown model_type \"{}\" (supported: mamba2, nemotron_h, qwen3_5, "
                    "qwen3_5_text, qwen3_5_moe, qwen3_5_moe_text, kimi_linear)",
                    path, printable(c.model_type)));
  }
  return c;
}

}  // namespace replayssm::model
