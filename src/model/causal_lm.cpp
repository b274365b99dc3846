#include "model/causal_lm.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <iostream>
#include <limits>
#include <sstream>
#include <stdexcept>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "model/moe.h"
#include "model/safetensors.h"

namespace replayssm::model {

const ssm::PrecisionPolicy& PolicyAssignment::for_layer(int layer) const {
  auto it = per_layer.find(layer);
  return it == per_layer.end() ? all : it->second;
}

std::string PolicyAssignment::to_string() const {
  std::string s = all.to_string();
  for (const auto& [layer, p] : per_layer) s += fmt::format(";{}={}", layer, p.to_string());
  return s;
}

CausalLM::CausalLM(CausalLM&&) noexcept = default;
CausalLM& CausalLM::operator=(CausalLM&&) noexcept = default;
CausalLM::~CausalLM() = default;

CausalLM CausalLM::load(const std::string& model_dir) {
  CausalLM m = build(model_dir, false);
  // Loaded as stored (such checkpoints are worth studying), but never silently.
  for (const NonFiniteTensor& t : m.non_finite_)
    std::cerr << fmt::format("warning: {}: tensor '{}' holds {} non-finite value{} (NaN or Inf) among {}; loaded as "
                             "stored\n",
                             t.file, t.name, t.count, t.count == 1 ? "" : "s", t.elements);
  return m;
}
CausalLM CausalLM::inspect(const std::string& model_dir) { return build(model_dir, true); }

CausalLM CausalLM::build(const std::string& model_dir, bool shapes_only) {
  CausalLM m;
  m.dir_ = model_dir;
  m.config_ = ModelConfig::load(model_dir);
  const ModelConfig& c = m.config_;
  m.checkpoint_ = std::make_shared<TensorStore>(model_dir);
  TensorStore& store = *m.checkpoint_;
  const WeightQuantization quantization = WeightQuantization::load(model_dir);
  std::unique_ptr<QuantizedWeightReader> quantized;
  if (quantization.format) quantized = std::make_unique<QuantizedWeightReader>(store, quantization);
  WeightLoader w(store, shapes_only, quantized.get());
  const int d = c.hidden_size, vocab = c.vocab_size;

  std::string base, embed_name, final_norm_name, norm_name = "norm", mixer_name;
  switch (c.arch) {
    case Architecture::mamba2:
      base = "backbone.";
      store.add_prefix_alias("backbone.embedding.", "backbone.embeddings.");
      embed_name = "backbone.embeddings.weight";
      final_norm_name = "backbone.norm_f.weight";
      break;
    case Architecture::nemotron_h:
      base = "model.";
      store.add_prefix_alias("backbone.", "model.");
      store.ignore_prefix("mtp.");
      embed_name = "model.embeddings.weight";
      final_norm_name = "model.norm_f.weight";
      break;
    case Architecture::qwen3_5:
      base = "model.";
      store.add_prefix_alias("model.language_model.", "model.");
      store.ignore_prefix("mtp.");
      store.ignore_prefix("model.visual.");
      embed_name = "model.embed_tokens.weight";
      final_norm_name = "model.norm.weight";
      break;
    case Architecture::kimi_linear:
      base = "model.";
      embed_name = "model.embed_tokens.weight";
      final_norm_name = "model.norm.weight";
      break;
  }
  m.embed_ = w.matrix(embed_name, vocab, d);
  for (int i = 0; i < static_cast<int>(c.layers.size()); ++i) {
    const std::string p = fmt::format("{}layers.{}.", base, i);
    Layer L;
    L.kind = c.layers[i];
    if (c.arch == Architecture::kimi_linear) {
      L.norm = w.vector(p + "input_layernorm.weight", d);
      if (L.kind == LayerKind::kda)
        L.mixer = std::make_unique<KdaMixer>(w, p + "self_attn", c.kda, d);
      else
        L.mixer = std::make_unique<MlaAttention>(w, p + "self_attn", c.mla, d);
      L.mlp_norm = w.vector(p + "post_attention_layernorm.weight", d);
      // The published layout names every MLP block_sparse_moe (transformers renames it mlp); the
      // probe is a tensor every block of the layer's kind has (an MoE block has no down_proj).
      const bool moe = c.layer_mlp_is_moe(i);
      const std::string published = p + "block_sparse_moe", in_memory = p + "mlp";
      const std::string probe = moe ? ".gate.weight" : ".down_proj.weight";
      if (w.contains(published + probe) && w.contains(in_memory + probe))
        throw std::runtime_error(fmt::format("{}: layer {} has both '{}.*' and '{}.*' tensors: expected one MLP",
                                             store.files_description(), i, published, in_memory));
      const std::string prefix = w.contains(in_memory + probe) ? in_memory : published;
      if (moe)
        L.mlp = std::make_unique<MixtureOfExperts>(w, prefix, c.moe, d);
      else
        L.mlp = std::make_unique<Mlp>(w, prefix, c.mlp, d);
    } else if (c.arch == Architecture::qwen3_5) {
      L.norm = w.vector(p + "input_layernorm.weight", d);
      if (L.kind == LayerKind::gated_deltanet)
        L.mixer = std::make_unique<GatedDeltaNet>(w, p + "linear_attn", c.gdn, d);
      else
        L.mixer = std::make_unique<Attention>(w, p + "self_attn", c.attention, d);
      L.mlp_norm = w.vector(p + "post_attention_layernorm.weight", d);
      if (c.mlp_is_moe)
        L.mlp = std::make_unique<MixtureOfExperts>(w, p + "mlp", c.moe, d);
      else
        L.mlp = std::make_unique<Mlp>(w, p + "mlp", c.mlp, d);
    } else {
      L.norm = w.vector(p + "norm.weight", d);
      switch (L.kind) {
        case LayerKind::mamba2:
          L.mixer = std::make_unique<Mamba2Mixer>(w, p + "mixer", c.mamba, d);
          break;
        case LayerKind::attention:
          L.mixer = std::make_unique<Attention>(w, p + "mixer", c.attention, d);
          break;
        case LayerKind::mlp:
          L.mixer = std::make_unique<Mlp>(w, p + "mixer", c.mlp, d);
          break;
        case LayerKind::moe:
          L.mixer = std::make_unique<MixtureOfExperts>(w, p + "mixer", c.moe, d);
          break;
        case LayerKind::gated_deltanet:
        case LayerKind::kda:
        case LayerKind::mla:
          throw std::logic_error(to_string(L.kind) + " layer in a Mamba-2 / Nemotron-H model");
      }
    }
    m.layers_.push_back(std::move(L));
  }
  m.final_norm_ = w.vector(final_norm_name, d);
  if (c.tie_word_embeddings) {
    // Tied: transformers uses the embedding matrix. A stored lm_head.weight must then be a copy of
    // it: a different one leaves open which matrix the checkpoint means.
    if (store.contains("lm_head.weight")) {
      store.check("lm_head.weight", {vocab, d});
      if (!store.same_values("lm_head.weight", embed_name))
        throw std::runtime_error(fmt::format(
            "{}: tensor 'lm_head.weight' differs from the embeddings '{}', but {} says tie_word_embeddings = true "
            "(expected no lm_head.weight, an identical copy, or tie_word_embeddings = false)",
            store.files_description(), embed_name, c.source));
    }
  } else {
    m.lm_head_ = w.matrix("lm_head.weight", vocab, d);
  }
  if (quantized) quantized->finish();
  store.check_all_used(fmt::format("{} ({})", to_string(c.arch), c.source));
  m.parameters_ = w.parameter_count();
  m.stored_parameters_ = w.stored_parameter_count();
  m.stored_bytes_ = w.stored_bytes();
  m.stored_scratch_floats_ = w.stored_scratch_floats();
  // The load read every tensor (values, NaN/Inf scans): from here on only what the forward reads
  // (expert matrices) is resident.
  store.release_pages();
  m.runnable_ = !shapes_only;
  m.non_finite_ = store.non_finite();
  if (quantized) {
    m.non_finite_.insert(m.non_finite_.end(), quantized->non_finite().begin(), quantized->non_finite().end());
    m.dequantized_ = quantized->dequantized();
    m.quantization_summary_ = quantized->describe();
  }
  return m;
}

std::vector<LayerInfo> CausalLM::layers() const {
  std::vector<LayerInfo> out;
  for (int i = 0; i < static_cast<int>(layers_.size()); ++i)
    out.push_back(LayerInfo{i, layers_[i].kind, layers_[i].mlp != nullptr});
  return out;
}

std::string CausalLM::describe(const std::vector<int64_t>& lengths, int threads) const {
  const ModelConfig& c = config_;
  std::ostringstream o;
  o << fmt::format("model          {}\n", dir_);
  o << fmt::format("model_type     {} (architecture {})\n", c.model_type, to_string(c.arch));
  o << fmt::format("hidden size    {}\nvocabulary     {}\n", c.hidden_size, c.vocab_size);
  o << fmt::format("LM head        {}\n",
                   c.tie_word_embeddings ? "tied to the embeddings" : "separate (lm_head.weight)");
  o << fmt::format("layers         {}: {}   (M Mamba-2, G Gated DeltaNet, K Kimi Delta Attention, * attention, - "
                   "MLP, E MoE{})\n",
                   c.layers.size(), c.pattern(),
                   !c.layer_has_mlp ? ""
                   : c.mlp_is_moe   ? "; every layer also has a mixture-of-experts MLP"
                   : !c.moe_mlp_layers.empty()
                       ? fmt::format("; every layer also has an MLP, a mixture of experts in layer{} {}",
                                     c.moe_mlp_layers.size() == 1 ? "" : "s", fmt::join(c.moe_mlp_layers, ","))
                       : "; every layer also has an MLP");
  const int n_m = static_cast<int>(std::count(c.layers.begin(), c.layers.end(), LayerKind::mamba2));
  const int n_g = static_cast<int>(std::count(c.layers.begin(), c.layers.end(), LayerKind::gated_deltanet));
  if (n_m) {
    const auto& s = c.mamba;
    o << fmt::format(
        "Mamba-2        {} layers: key heads (n_groups) {}, value heads {}, dk (state_size) {}, dv (head_dim) {}, "
        "conv kernel {}, dt clamp [{}, {}], gated-norm group {}\n",
        n_m, s.n_groups, s.num_heads, s.state_size, s.head_dim, s.conv_kernel, s.dt_min, s.dt_max, s.norm_group_size);
  }
  if (n_g) {
    const auto& s = c.gdn;
    o << fmt::format("Gated DeltaNet {} layers: key heads {}, value heads {}, dk {}, dv {}, conv kernel {}\n", n_g,
                     s.num_k_heads, s.num_v_heads, s.dk, s.dv, s.conv_kernel);
  }
  const int n_kda = static_cast<int>(std::count(c.layers.begin(), c.layers.end(), LayerKind::kda));
  if (n_kda) {
    const auto& s = c.kda;
    o << fmt::format("KDA            {} layers: heads {} (each its own key head), dk = dv = {}, conv kernel {}, "
                     "channel-wise decay\n",
                     n_kda, s.num_heads, s.head_dim, s.conv_kernel);
  }
  const int n_mla = static_cast<int>(std::count(c.layers.begin(), c.layers.end(), LayerKind::mla));
  if (n_mla) {
    const auto& a = c.mla;
    o << fmt::format("attention      {} layers: multi-head latent attention, heads {}, q_lora_rank {}, kv_lora_rank {}, "
                     "qk nope/rope head dims {}/{} (no positional encoding), v_head_dim {}\n",
                     n_mla, a.num_heads, a.q_lora_rank ? fmt::format("{}", a.q_lora_rank) : std::string("none"),
                     a.kv_lora_rank, a.qk_nope_head_dim, a.qk_rope_head_dim, a.v_head_dim);
  }
  if (c.attention_layer_count()) {
    const auto& a = c.attention;
    o << fmt::format("attention      {} layers: heads {}, kv heads {}, head_dim {}, {}{}{}\n",
                     c.attention_layer_count(), a.num_heads, a.num_kv_heads, a.head_dim,
                     a.rotary_dim ? fmt::format("RoPE on {} dims (theta {})", a.rotary_dim, a.rope_theta)
                                  : std::string("no positional encoding"),
                     a.output_gate ? ", sigmoid output gate" : "", a.qk_norm ? ", q/k RMSNorm" : "");
  }
  const int n_mlp = static_cast<int>(std::count(c.layers.begin(), c.layers.end(), LayerKind::mlp)) +
                    (c.layer_has_mlp && !c.mlp_is_moe
                         ? static_cast<int>(c.layers.size()) - static_cast<int>(c.moe_mlp_layers.size())
                         : 0);
  if (n_mlp)
    o << fmt::format("MLP            {} blocks: intermediate {}, {}\n", n_mlp, c.mlp.intermediate_size,
                     c.mlp.activation == MlpActivation::relu2 ? "relu^2" : "SwiGLU");
  if (c.moe_layer_count()) {
    const MoeShape& e = c.moe;
    const RouterSpec& r = e.router;
    o << fmt::format(
        "MoE            {} layers: {} experts, top {}{}, {} scores{}, {}{}, experts {} intermediate {}{}{}\n",
        c.moe_layer_count(), r.n_experts, r.top_k,
        r.n_group > 1 ? fmt::format(" from the {} best of {} groups", r.topk_group, r.n_group) : std::string(),
        r.score == RouterSpec::Score::softmax ? "softmax" : "sigmoid",
        r.correction_bias ? " + correction bias" : "", r.normalise ? "renormalised" : "not renormalised",
        r.scaling != 1.0f ? fmt::format(", scaled by {}", r.scaling) : std::string(),
        e.activation == ExpertActivation::relu2 ? "relu^2" : "SwiGLU", e.expert_intermediate,
        e.latent_size ? fmt::format(" (latent {})", e.latent_size) : std::string(),
        e.shared_intermediate ? fmt::format(", shared expert intermediate {}{}", e.shared_intermediate,
                                            e.shared_gate ? " (sigmoid-gated)" : "")
                              : std::string());
  }
  o << fmt::format("parameters     {}\n", parameters_);
  o << quantization_summary_;
  o << memory_description(lengths, resolve_threads(threads));
  if (!non_finite_.empty()) {
    o << fmt::format("non-finite     {} {} NaN or Inf (loaded as stored):\n", non_finite_.size(),
                     non_finite_.size() == 1 ? "tensor holds" : "tensors hold");
    for (const NonFiniteTensor& t : non_finite_)
      o << fmt::format("               {}: {} of {} ({})\n", t.name, t.count, t.elements, t.file);
  }
  return o.str();
}

namespace {
constexpr int64_t kPositionChunk = 2048;  // rows of a position-wise block (MLP, MoE) at once
constexpr int64_t kLmHeadRows = 256;      // ForwardOptions::chunk_positions' default
}  // namespace

CausalLM::MemoryEstimate CausalLM::forward_memory(int64_t n, int threads) const {
  if (n < 0 || threads < 1)
    throw std::invalid_argument(
        fmt::format("forward_memory: {} positions, {} threads (expected >= 0 and >= 1)", n, threads));
  const ModelConfig& c = config_;
  MemoryEstimate m;
  m.weight_bytes = 4 * static_cast<int64_t>(parameters_ - stored_parameters_);
  m.mapped_expert_bytes = static_cast<int64_t>(stored_bytes_);
  // Per position, the widest token mixer: its projections, its output before out_proj and every
  // head group's copy of q, k, v, gates and outputs handed to the sequence emulator.
  for (const LayerKind k : c.layers) {
    int64_t w = 0;
    if (k == LayerKind::mamba2) {
      const Mamba2Shape& s = c.mamba;
      w = int64_t{s.in_proj_width()} + s.intermediate() + 2 * int64_t{s.n_groups} * s.state_size +
          int64_t{s.num_heads} * (1 + 2 * int64_t{s.head_dim});
    } else if (k == LayerKind::gated_deltanet) {
      const GdnShape& s = c.gdn;
      w = int64_t{s.conv_dim()} + 2 * int64_t{s.value_dim()} + 2 * int64_t{s.num_v_heads} +
          2 * int64_t{s.num_k_heads} * s.dk + int64_t{s.num_v_heads} * (2 + 2 * int64_t{s.dv});
    } else if (k == LayerKind::attention) {
      const AttentionShape& s = c.attention;
      w = int64_t{s.q_proj_width()} + 3 * int64_t{s.attention_width()} + 2 * int64_t{s.kv_width()};
    } else if (k == LayerKind::kda) {
      // q, k, v projections and their convolved copies, the decay (dk per head), the output gate,
      // beta, and the emulator's per-head copies of q, k, decay, v and the output.
      const KdaShape& s = c.kda;
      const int64_t hd = int64_t{s.num_heads} * s.head_dim;
      w = 6 * hd + 2 * hd + int64_t{s.num_heads} + 5 * hd;
    } else if (k == LayerKind::mla) {
      // q, the latent [c | k_rope], its expansion [k_nope | v], the full per-head keys and the output.
      const MlaShape& s = c.mla;
      w = int64_t{s.q_width()} + s.kv_a_width() + s.kv_b_width() + int64_t{s.q_width()} +
          int64_t{s.num_heads} * s.v_head_dim;
    }
    m.mixer_width = std::max(m.mixer_width, w);
  }
  // Position-wise blocks run on at most kPositionChunk rows at once.
  const int64_t rows = std::min(n, kPositionChunk);
  int64_t block = 0;
  if (c.moe_layer_count()) block = std::max(block, MixtureOfExperts::activation_floats(c.moe, c.hidden_size, rows));
  if (c.mlp.intermediate_size) block = std::max(block, rows * (2 * int64_t{c.mlp.intermediate_size} + c.hidden_size));
  m.position_block_width = rows ? block / rows : 0;
  if (c.moe_layer_count() && rows) {
    m.expert_workers = MixtureOfExperts::workers(c.moe, rows, threads);
    m.expert_worker_floats = MixtureOfExperts::worker_floats(c.moe, c.hidden_size, rows) + stored_scratch_floats_;
    m.expert_working_bytes = 4 * m.expert_workers * m.expert_worker_floats;
  }
  // Residual stream, normalised input and block output (3 x N x hidden), the widest mixer, the
  // widest position-wise block, and one LM-head chunk of logits.
  m.activation_bytes =
      4 * (n * (3 * int64_t{c.hidden_size} + m.mixer_width) + block + std::min(n, kLmHeadRows) * c.vocab_size);
  return m;
}

std::string CausalLM::memory_description(const std::vector<int64_t>& lengths, int threads) const {
  const auto size = [](int64_t b) {
    const double mib = static_cast<double>(b) / (1024.0 * 1024.0);
    return mib < 1024.0 ? fmt::format("{:.2f} MiB", mib) : fmt::format("{:.2f} GiB", mib / 1024.0);
  };
  const MemoryEstimate m0 = forward_memory(0, threads), block = forward_memory(kPositionChunk, threads);
  std::ostringstream o;
  if (stored_parameters_ == 0) {
    o << fmt::format("memory         weights {} (4 B x {} parameters, float32, each tensor held once)\n",
                     size(m0.weight_bytes), parameters_);
  } else {
    o << fmt::format("memory         weights {} (4 B x {} parameters, float32, each tensor held once: all but the "
                     "experts') + experts {} ({} parameters as stored, read from the memory-mapped checkpoint)\n",
                     size(m0.weight_bytes), parameters_ - stored_parameters_, size(m0.mapped_expert_bytes),
                     stored_parameters_);
    o << fmt::format("               experts are converted to float32 when the forward reaches them: {} floats per "
                     "worker thread running an expert (its matrices and one block of 128 rows{}), at most min(threads = "
                     "{}, experts = {}, top_k x rows) at once\n",
                     block.expert_worker_floats,
                     stored_scratch_floats_ ? fmt::format(", {} floats of dequantization scales", stored_scratch_floats_)
                                            : std::string(),
                     threads, config_.moe.router.n_experts);
  }
  o << fmt::format(
      "               forward of one policy over N positions ~ weights{} + 4 B x (N x (3 x hidden + W) + B + "
      "min(N, {}) x vocab), W = {} floats (widest token mixer per position), B = the widest position-wise block "
      "on min(N, {}) rows ({} floats per row); + 4 B x N x hidden per further policy\n",
      stored_parameters_ ? " + experts + the experts' working set" : "", kLmHeadRows, m0.mixer_width, kPositionChunk,
      block.position_block_width);
  for (const int64_t n : lengths) {
    const MemoryEstimate m = forward_memory(n, threads);
    o << fmt::format("               N = {:>6}: {} ({} activations{})\n", n, size(m.total()), size(m.activation_bytes),
                     stored_parameters_ ? fmt::format(", {} experts' working set", size(m.expert_working_bytes))
                                        : std::string());
  }
  return o.str();
}

Mat CausalLM::final_hidden(const std::vector<int64_t>& tokens, const PolicyAssignment& policy, int threads,
                           const std::function<void(int, int, double)>& on_layer_done,
                           const SequenceObserver* observe) const {
  if (!runnable_)
    throw std::logic_error(fmt::format("{}: model was opened with inspect() (no weights read); use load()", dir_));
  const int t = resolve_threads(threads);
  const int n = static_cast<int>(tokens.size());
  const int d = config_.hidden_size;
  for (int i = 0; i < n; ++i)
    if (tokens[i] < 0 || tokens[i] >= config_.vocab_size)
      throw std::invalid_argument(
          fmt::format("token {} at position {} is outside the vocabulary [0, {})", tokens[i], i, config_.vocab_size));
  Mat h(n, d);
  for (int i = 0; i < n; ++i) h.row(i) = embed_.row(tokens[i]);
  const float eps = static_cast<float>(config_.norm_eps);
  const bool plus_one = config_.norm_plus_one;
  Mat xn, out;
  // Norm + block over all positions (token mixers need the whole sequence).
  auto whole = [&](const Vec& norm, const Block& block, const LayerContext& ctx) {
    xn = h;
    rms_norm_rows(xn, norm, eps, plus_one, d, t);
    block.forward(xn, out, ctx);
    h += out;
  };
  // Position-wise blocks (MLPs) in chunks of positions, so their wide intermediates stay small.
  constexpr int kChunk = 2048;
  auto chunked = [&](const Vec& norm, const Block& block, const LayerContext& ctx) {
    for (int r0 = 0; r0 < n; r0 += kChunk) {
      const int rows = std::min(kChunk, n - r0);
      xn = h.middleRows(r0, rows);
      rms_norm_rows(xn, norm, eps, plus_one, d, t);
      block.forward(xn, out, ctx);
      h.middleRows(r0, rows) += out;
    }
  };
  for (int li = 0; li < static_cast<int>(layers_.size()); ++li) {
    const Layer& L = layers_[li];
    const LayerContext ctx{li, &policy.for_layer(li), t, observe};
    const auto start = std::chrono::steady_clock::now();
    if (L.kind == LayerKind::mlp || L.kind == LayerKind::moe)
      chunked(L.norm, *L.mixer, ctx);
    else
      whole(L.norm, *L.mixer, ctx);
    if (L.mlp) chunked(L.mlp_norm, *L.mlp, ctx);
    if (on_layer_done)
      on_layer_done(li, static_cast<int>(layers_.size()),
                    std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  rms_norm_rows(h, final_norm_, eps, plus_one, d, t);
  return h;
}

void CausalLM::lm_head(const Eigen::Ref<const Mat>& h, bool log_softmax, int threads, Mat& out) const {
  if (!runnable_)
    throw std::logic_error(fmt::format("{}: model was opened with inspect() (no weights read); use load()", dir_));
  if (h.cols() != config_.hidden_size)
    throw std::invalid_argument(
        fmt::format("lm_head: hidden rows have {} columns, expected hidden size {}", h.cols(), config_.hidden_size));
  const Mat& w = config_.tie_word_embeddings ? embed_ : lm_head_;
  const Eigen::Index vocab = w.rows();
  const std::size_t count = static_cast<std::size_t>(h.rows());
  out.resize(static_cast<Eigen::Index>(count), vocab);
  const int t = resolve_threads(threads);
  // Rows of one chunk round exactly as in any other chunking: the host ISA has no FMA (CMakeLists.txt),
  // so Eigen's vector and remainder kernels round every product and sum alike.
  // Fixed blocks of the vocabulary (not per thread): results do not depend on the thread count.
  constexpr Eigen::Index kCols = 2048;
  const int col_blocks = static_cast<int>((vocab + kCols - 1) / kCols);
  parallel_for(col_blocks, t, [&](int b) {
    const Eigen::Index c0 = b * kCols, c = std::min(kCols, vocab - c0);
    out.middleCols(c0, c).noalias() = h * w.middleRows(c0, c).transpose();
  });
  if (log_softmax) log_softmax_rows(out, t);
}

void log_softmax_rows(Mat& rows, int threads) {
  const Eigen::Index vocab = rows.cols();
  parallel_for(static_cast<int>(rows.rows()), resolve_threads(threads), [&](int r) {
    float* row = rows.data() + static_cast<Eigen::Index>(r) * vocab;
    float mx = -std::numeric_limits<float>::infinity();
    for (Eigen::Index j = 0; j < vocab; ++j) mx = std::max(mx, row[j]);
    double sum = 0.0;
    for (Eigen::Index j = 0; j < vocab; ++j) sum += std::exp(static_cast<double>(row[j]) - mx);
    const double lse = mx + std::log(sum);
    for (Eigen::Index j = 0; j < vocab; ++j) row[j] = static_cast<float>(static_cast<double>(row[j]) - lse);
  });
}

void CausalLM::forward(const std::vector<int64_t>& tokens, const std::vector<PolicyAssignment>& variants,
                       const ForwardOptions& options, const ChunkCallback& callback) const {
  if (variants.empty()) throw std::invalid_argument("forward: no policy given (expected at least one variant)");
  if (options.chunk_positions <= 0)
    throw std::invalid_argument(fmt::format("forward: chunk_positions is {}, expected > 0", options.chunk_positions));
  std::vector<Mat> hidden;
  hidden.reserve(variants.size());
  for (std::size_t v = 0; v < variants.size(); ++v) {
    std::function<void(int, int, double)> report;
    if (options.on_layer_done)
      report = [&, v](int layer, int n, double s) { options.on_layer_done(static_cast<int>(v), layer, n, s); };
    hidden.push_back(final_hidden(tokens, variants[v], options.threads, report));
  }
  const std::size_t n = tokens.size();
  std::vector<Mat> out(variants.size());
  for (std::size_t b = 0; b < n; b += static_cast<std::size_t>(options.chunk_positions)) {
    const std::size_t count = std::min(n - b, static_cast<std::size_t>(options.chunk_positions));
    LogitsChunk chunk;
    chunk.begin = b;
    chunk.count = count;
    chunk.vocab = config_.vocab_size;
    for (std::size_t v = 0; v < variants.size(); ++v) {
      lm_head(hidden[v].middleRows(static_cast<Eigen::Index>(b), static_cast<Eigen::Index>(count)), options.log_softmax,
              options.threads, out[v]);
      chunk.rows.push_back(out[v].data());
    }
    callback(chunk);
  }
}

Mat CausalLM::log_probs(const std::vector<int64_t>& tokens, const PolicyAssignment& policy,
                        const ForwardOptions& options) const {
  Mat all(static_cast<Eigen::Index>(tokens.size()), config_.vocab_size);
  forward(tokens, {policy}, options, [&](const LogitsChunk& c) {
    all.middleRows(static_cast<Eigen::Index>(c.begin), static_cast<Eigen::Index>(c.count)) =
        Eigen::Map<const Mat>(c.rows[0], static_cast<Eigen::Index>(c.count), c.vocab);
  });
  return all;
}

}  // namespace replayssm::model
