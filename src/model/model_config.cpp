#include "model/model_config.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>
#include <stdexcept>

#include <fmt/format.h>

#include "model/json_util.h"

namespace replayssm::model {
namespace {

[[noreturn]] void fail(const JsonObject& j, const std::string& what) {
  throw std::runtime_error(fmt::format("{}: {}", j.where(), what));
}

int positive(const JsonObject& j, const std::string& key) {
  const int64_t v = j.get_int(key);
  if (v <= 0 || v > (int64_t{1} << 30))
    fail(j, fmt::format("config key \"{}\" is {}, expected a positive integer", key, v));
  return static_cast<int>(v);
}
int positive(const JsonObject& j, const std::string& key, int dflt) { return j.has(key) ? positive(j, key) : dflt; }

// First present key among aliases (transformers' legacy spellings), else the default.
int positive_alias(const JsonObject& j, std::initializer_list<const char*> keys, int dflt) {
  for (const char* k : keys)
    if (j.has(k)) return positive(j, k);
  return dflt;
}
template <class F>
auto alias(const JsonObject& j, std::initializer_list<const char*> keys, F get) -> decltype(get(std::string())) {
  for (const char* k : keys)
    if (j.has(k)) return get(std::string(k));
  return get(std::string(*keys.begin()));
}

void load_mamba2(ModelConfig& c, const JsonObject& j) {
  c.vocab_size = positive(j, "vocab_size");
  c.hidden_size = positive(j, "hidden_size");
  const int n_layers = positive(j, "num_hidden_layers");
  c.layers.assign(n_layers, LayerKind::mamba2);
  c.norm_eps = j.get_double("layer_norm_epsilon", 1e-5);
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
  if (j.has("time_step_limit")) {
    const auto lim = j.get_double_list("time_step_limit");
    if (lim.size() != 2 || !(lim[0] <= lim[1]))
      fail(j, fmt::format("config key \"time_step_limit\" is {}, expected [min, max]",
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
    fail(j, fmt::format("hidden_act \"{}\" is not supported (expected \"silu\")", act));
}

void load_nemotron_h(ModelConfig& c, const JsonObject& j) {
  c.vocab_size = positive(j, "vocab_size");
  c.hidden_size = positive(j, "hidden_size");
  c.norm_eps = j.get_double("layer_norm_epsilon", 1e-5);
  c.tie_word_embeddings = j.get_bool("tie_word_embeddings", false);
  std::vector<std::string> types;
  if (j.has("layers_block_type")) {
    types = j.get_string_list("layers_block_type");
  } else if (j.has("hybrid_override_pattern")) {
    const std::string p = j.get_string("hybrid_override_pattern");
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
          fail(j, fmt::format("hybrid_override_pattern \"{}\": character '{}' at layer {} is not one of M * - E", p,
                              p[i], i));
      }
    }
  } else {
    fail(j, "missing config key \"layers_block_type\" (or the legacy \"hybrid_override_pattern\")");
  }
  if (types.empty()) fail(j, "the layer pattern is empty");
  for (std::size_t i = 0; i < types.size(); ++i) {
    const std::string& t = types[i];
    if (t == "linear_attention" || t == "mamba")
      c.layers.push_back(LayerKind::mamba2);
    else if (t == "full_attention" || t == "attention")
      c.layers.push_back(LayerKind::attention);
    else if (t == "mlp")
      c.layers.push_back(LayerKind::mlp);
    else if (t == "moe")
      fail(j, fmt::format("layer {} is a mixture-of-experts layer ('E'): MoE layers are not supported yet "
                          "(dense Nemotron-H only)",
                          i));
    else
      fail(j, fmt::format("layer {} has type \"{}\", expected linear_attention, full_attention, mlp (or moe)", i, t));
  }
  auto& m = c.mamba;
  const bool any_mamba = c.ssm_layer_count() > 0;
  if (any_mamba) {
    m.num_heads = positive(j, "mamba_num_heads");
    m.head_dim = positive(j, "mamba_head_dim");
    m.state_size = positive(j, "ssm_state_size");
    m.n_groups = positive_alias(j, {"mamba_n_groups", "n_groups"}, 8);
    m.conv_kernel = positive_alias(j, {"mamba_d_conv", "conv_kernel"}, 4);
    m.conv_bias =
        alias(j, {"mamba_conv_bias", "use_conv_bias"}, [&](const std::string& k) { return j.get_bool(k, true); });
    m.proj_bias = j.get_bool("use_bias", false);
    // NemotronHMamba2Mixer clamps dt to [time_step_min, inf), whatever time_step_limit says.
    m.dt_min =
        alias(j, {"mamba_dt_min", "time_step_min"}, [&](const std::string& k) { return j.get_double(k, 0.001); });
    m.dt_max = std::numeric_limits<double>::infinity();
    m.norm_eps = c.norm_eps;
    if (m.num_heads % m.n_groups != 0)
      fail(j, fmt::format("mamba_num_heads {} is not a multiple of n_groups {}", m.num_heads, m.n_groups));
    m.norm_group_size = m.intermediate() / m.n_groups;
    const std::string act = j.get_string("mamba_hidden_act", "silu");
    if (act != "silu" && act != "swish")
      fail(j, fmt::format("mamba_hidden_act \"{}\" is not supported (expected \"silu\")", act));
  }
  if (c.attention_layer_count() > 0) {
    auto& a = c.attention;
    a.num_heads = positive(j, "num_attention_heads");
    a.num_kv_heads = positive(j, "num_key_value_heads", a.num_heads);
    a.head_dim = j.has("head_dim") ? positive(j, "head_dim") : positive(j, "attention_head_dim", 128);
    if (a.num_heads % a.num_kv_heads != 0)
      fail(j, fmt::format("num_attention_heads {} is not a multiple of num_key_value_heads {}", a.num_heads,
                          a.num_kv_heads));
    a.bias = false;  // NemotronHAttention has no projection biases
    a.rotary_dim = 0;
  }
  const bool any_mlp = std::count(c.layers.begin(), c.layers.end(), LayerKind::mlp) > 0;
  if (any_mlp) {
    c.mlp.intermediate_size = positive(j, "intermediate_size");
    c.mlp.bias = j.get_bool("mlp_bias", false);
    const std::string act = j.get_string("mlp_hidden_act", "relu2");
    if (act != "relu2") fail(j, fmt::format("mlp_hidden_act \"{}\" is not supported (expected \"relu2\")", act));
    c.mlp.activation = MlpActivation::relu2;
  }
}

void load_qwen3_5_text(ModelConfig& c, const JsonObject& j, const JsonObject* outer) {
  c.vocab_size = positive(j, "vocab_size");
  c.hidden_size = positive(j, "hidden_size");
  const int n_layers = positive(j, "num_hidden_layers");
  c.norm_eps = j.get_double("rms_norm_eps", 1e-6);
  c.norm_plus_one = true;
  c.layer_has_mlp = true;
  c.tie_word_embeddings = j.has("tie_word_embeddings") ? j.get_bool("tie_word_embeddings")
                          : outer                      ? outer->get_bool("tie_word_embeddings", false)
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
      fail(j,
           fmt::format("layer_types[{}] is \"{}\", expected \"linear_attention\" or \"full_attention\"", i, types[i]));
  }
  const std::string act = j.get_string("hidden_act", "silu");
  if (act != "silu" && act != "swish")
    fail(j, fmt::format("hidden_act \"{}\" is not supported (expected \"silu\")", act));
  c.mlp.intermediate_size = positive(j, "intermediate_size");
  c.mlp.activation = MlpActivation::swiglu;
  c.mlp.bias = false;

  auto& g = c.gdn;
  g.num_k_heads = positive(j, "linear_num_key_heads", 16);
  g.num_v_heads = positive(j, "linear_num_value_heads", 32);
  g.dk = positive(j, "linear_key_head_dim", 128);
  g.dv = positive(j, "linear_value_head_dim", 128);
  g.conv_kernel = positive(j, "linear_conv_kernel_dim", 4);
  g.norm_eps = c.norm_eps;
  if (g.num_v_heads % g.num_k_heads != 0)
    fail(j, fmt::format("linear_num_value_heads {} is not a multiple of linear_num_key_heads {}", g.num_v_heads,
                        g.num_k_heads));

  auto& a = c.attention;
  a.num_heads = positive(j, "num_attention_heads");
  a.num_kv_heads = positive(j, "num_key_value_heads");
  a.head_dim = positive(j, "head_dim", 256);  // Qwen3_5TextConfig default
  if (a.num_heads % a.num_kv_heads != 0)
    fail(j, fmt::format("num_attention_heads {} is not a multiple of num_key_value_heads {}", a.num_heads,
                        a.num_kv_heads));
  a.bias = j.get_bool("attention_bias", false);
  a.output_gate = true;
  a.qk_norm = true;
  a.norm_eps = c.norm_eps;
  // RoPE parameters: rope_parameters (or legacy rope_scaling) first, then top-level keys
  // (transformers' standardisation order); partial_rotary_factor defaults to 0.25 for Qwen3.5.
  double theta = j.get_double("rope_theta", 10000.0);
  double partial = j.get_double("partial_rotary_factor", 0.25);
  std::string rope_type = "default";
  for (const char* key : {"rope_parameters", "rope_scaling"}) {
    if (!j.has(key)) continue;
    const JsonObject rp = j.get_object(key);
    theta = rp.get_double("rope_theta", theta);
    partial = rp.get_double("partial_rotary_factor", partial);
    rope_type = rp.has("rope_type") ? rp.get_string("rope_type") : rp.get_string("type", "default");
    break;
  }
  if (rope_type != "default")
    fail(j,
         fmt::format("rope_type \"{}\" is not supported (expected \"default\"; text positions make M-RoPE plain RoPE)",
                     rope_type));
  if (!(partial > 0.0 && partial <= 1.0)) fail(j, fmt::format("partial_rotary_factor {} is not in (0, 1]", partial));
  a.rotary_dim = static_cast<int>(a.head_dim * partial);
  if (a.rotary_dim % 2 != 0)
    fail(j, fmt::format("rotary dimension {} (head_dim * partial_rotary_factor) is odd", a.rotary_dim));
  a.rope_theta = theta;
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
  }
  return "?";
}

std::string ModelConfig::pattern() const {
  std::string p;
  for (LayerKind k : layers) p += pattern_char(k);
  return p;
}

int ModelConfig::ssm_layer_count() const {
  return static_cast<int>(std::count_if(layers.begin(), layers.end(), [](LayerKind k) {
    return k == LayerKind::mamba2 || k == LayerKind::gated_deltanet;
  }));
}
int ModelConfig::attention_layer_count() const {
  return static_cast<int>(std::count(layers.begin(), layers.end(), LayerKind::attention));
}

ModelConfig ModelConfig::load(const std::string& model_dir) {
  const std::filesystem::path p = std::filesystem::path(model_dir) / "config.json";
  if (!std::filesystem::is_directory(model_dir))
    throw std::runtime_error(
        fmt::format("{}: not a model directory (expected a directory with config.json and "
                    "model.safetensors)",
                    model_dir));
  if (!std::filesystem::exists(p)) throw std::runtime_error(fmt::format("{}: missing config.json", model_dir));
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
  } else if (c.model_type == "qwen3_5_moe" || c.model_type == "qwen3_5_moe_text" || c.model_type == "qwen3_next") {
    throw std::runtime_error(
        fmt::format("{}: model_type \"{}\" is a mixture-of-experts model: not supported yet "
                    "(supported: mamba2, nemotron_h, qwen3_5, qwen3_5_text)",
                    path, c.model_type));
  } else {
    throw std::runtime_error(
        fmt::format("{}: unknown model_type \"{}\" (supported: mamba2, nemotron_h, qwen3_5, "
                    "qwen3_5_text)",
                    path, c.model_type));
  }
  return c;
}

}  // namespace replayssm::model
