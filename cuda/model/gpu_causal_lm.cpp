// GpuCausalLM (gpu_causal_lm.h): the layer loop of model::CausalLM::final_hidden on the device, with
// the same order of norms, blocks and residual adds, position-wise blocks in the same chunks.
#include "model/gpu_causal_lm.h"

#include <algorithm>
#include <chrono>
#include <optional>
#include <stdexcept>
#include <vector>

#include <fmt/format.h>

#include "model/attention_gpu.h"
#include "model/gpu_blocks.h"
#include "model/gpu_kimi_blocks.h"
#include "model/gpu_timing.h"
#include "model/linear_gpu.h"
#include "model/model_ops.h"
#include "model/moe.h"
#include "ssm/sequence_scan.h"
#include "model/cublas_api.h"

namespace replayssm::cuda {
namespace {

// Rows of a position-wise block (MLP) at once: CausalLM::final_hidden's chunk.
constexpr int64_t kPositionChunk = 2048;

void check_cublas(cublasStatus_t s, const char* call) {
  if (s != CUBLAS_STATUS_SUCCESS)
    throw std::runtime_error(fmt::format("{} failed: {} ({})", call, cublas_api().status_name(s), cublas_api().status_string(s)));
}

DeviceBuffer<float> upload_vec(const model::Vec& v) {
  DeviceBuffer<float> b;
  b.upload(v.data(), static_cast<std::size_t>(v.size()));
  REPLAYSSM_CUDA_CHECK(cudaDeviceSynchronize());
  return b;
}

bool position_wise(model::LayerKind k) { return k == model::LayerKind::mlp || k == model::LayerKind::moe; }

// Floats of the shared arena a block uses over `rows` positions; -1 for a block with scratch of its own.
int64_t arena_floats_of(const GpuBlock& b, int64_t rows) {
  if (const auto* x = dynamic_cast<const GpuMamba2Mixer*>(&b)) return x->arena_floats(rows);
  if (const auto* x = dynamic_cast<const GpuGatedDeltaNet*>(&b)) return x->arena_floats(rows);
  if (const auto* x = dynamic_cast<const GpuMlp*>(&b)) return x->arena_floats(rows);
  if (const auto* x = dynamic_cast<const GpuKdaMixer*>(&b)) return x->arena_floats(rows);
  if (const auto* x = dynamic_cast<const GpuMlaAttention*>(&b)) return x->arena_floats(rows);
  if (const auto* x = dynamic_cast<const GpuMixtureOfExperts*>(&b)) return x->arena_floats(rows);
  return -1;
}

// The GPU twin of a CPU position-wise block (a layer's MLP, or Nemotron-H's MLP / MoE layer).
std::unique_ptr<GpuBlock> position_wise_twin(const model::Block& cpu, GemmPrecision gemm, const ScratchArena& arena) {
  if (const auto* mlp = dynamic_cast<const model::Mlp*>(&cpu)) return std::make_unique<GpuMlp>(*mlp, gemm, arena);
  return std::make_unique<GpuMixtureOfExperts>(dynamic_cast<const model::MixtureOfExperts&>(cpu), gemm, arena);
}
// Interval categories of a timed forward (GpuForwardTiming).
enum TimingCategory : int { kTotal, kAttentionLayers, kSsmLayers, kMlpLayers, kAttentionGemm, kSsmGemm, kMlpGemm, kCategories };
int layer_category(model::LayerKind k) {
  if (position_wise(k)) return kMlpLayers;
  return model::is_ssm_layer(k) ? kSsmLayers : kAttentionLayers;
}
int gemm_category(int layer) { return layer - kAttentionLayers + kAttentionGemm; }

}  // namespace

struct GpuCausalLM::Impl {
  std::string dir;
  model::ModelConfig config;
  GemmPrecision gemm = GemmPrecision::fp32;
  cudaStream_t stream = nullptr;
  cublasHandle_t cublas = nullptr;
  struct Layer {
    model::LayerKind kind;
    DeviceBuffer<float> norm, mlp_norm;
    std::unique_ptr<GpuBlock> mixer, mlp;
  };
  std::vector<Layer> layers;
  GpuLinear lm_head;
  DeviceMatrixBuffer embedding;  // empty when tied: the LM head's weight is the table
  DeviceBuffer<float> final_norm;
  ScratchArena arena = std::make_shared<DeviceBuffer<float>>();
  mutable DeviceBuffer<float> normed, block_out;
  mutable DeviceBuffer<int32_t> token_ids;
  bool timing = false;
  mutable std::unique_ptr<GpuIntervals> intervals;
  mutable GpuForwardTiming last_timing;

  ~Impl() {
    if (cublas) cublas_api().destroy(cublas);
    if (stream) cudaStreamDestroy(stream);
  }
  ConstDeviceMatrix table() const {
    return config.tie_word_embeddings ? lm_head.weight() : ConstDeviceMatrix(embedding.view());
  }
  // Floats of the shared arena for a forward over n positions: the largest of our blocks' needs
  // (token mixers over all n positions, position-wise blocks over chunks).
  int64_t arena_floats(int64_t n) const {
    int64_t f = 0;
    auto need = [&](const GpuBlock* b, int64_t rows) { f = std::max(f, arena_floats_of(*b, rows)); };
    for (const Layer& L : layers) {
      need(L.mixer.get(), position_wise(L.kind) ? std::min(n, kPositionChunk) : n);
      if (L.mlp) need(L.mlp.get(), std::min(n, kPositionChunk));
    }
    return f;
  }
};

std::string GpuCausalLM::unsupported_reason(const model::CausalLM& cpu) {
  if (!cpu.runnable()) return "the model was opened with inspect() (no weights read); load() it";
  const model::ModelConfig& c = cpu.config();
  const auto& layers = cpu.layer_blocks();
  int64_t expert_bytes = 0;
  int first_moe = -1;
  auto moe = [&](int li, const model::Block* b) {
    const auto* m = dynamic_cast<const model::MixtureOfExperts*>(b);
    if (!m) return false;
    expert_bytes += GpuMixtureOfExperts::expert_weight_bytes(m->shape(), m->hidden());
    if (first_moe < 0) first_moe = li;
    return true;
  };
  for (int li = 0; li < static_cast<int>(layers.size()); ++li) {
    const auto& L = layers[li];
    const std::string kind = model::to_string(L.kind);
    const model::Block* m = L.mixer.get();
    const bool twin = (L.kind == model::LayerKind::mamba2 && dynamic_cast<const model::Mamba2Mixer*>(m)) ||
                      (L.kind == model::LayerKind::gated_deltanet && dynamic_cast<const model::GatedDeltaNet*>(m)) ||
                      (L.kind == model::LayerKind::attention && dynamic_cast<const model::Attention*>(m)) ||
                      (L.kind == model::LayerKind::mlp && dynamic_cast<const model::Mlp*>(m)) ||
                      (L.kind == model::LayerKind::kda && dynamic_cast<const model::KdaMixer*>(m)) ||
                      (L.kind == model::LayerKind::mla && dynamic_cast<const model::MlaAttention*>(m)) ||
                      (L.kind == model::LayerKind::moe && moe(li, m));
    if (!twin) return fmt::format("layer {} ({}) has no GPU twin yet; use --device cpu", li, kind);
    if (L.mlp && !dynamic_cast<const model::Mlp*>(L.mlp.get()) && !moe(li, L.mlp.get()))
      return fmt::format("layer {} ({}) has an MLP block with no GPU twin yet; use --device cpu", li, kind);
  }
  // The GPU scan's head limits (cuda/ssm/sequence_scan.h), for the SSM kinds present.
  auto scan_limit = [&](model::LayerKind kind, int dk, int dv) -> std::string {
    if (std::find(c.layers.begin(), c.layers.end(), kind) == c.layers.end() || (dk <= kScanMaxDk && dv <= kScanMaxDv))
      return "";
    return fmt::format("{} layers have dk {} and dv {}, beyond the GPU scan's limits {} and {}; use --device cpu",
                       model::to_string(kind), dk, dv, kScanMaxDk, kScanMaxDv);
  };
  for (const std::string& r : {scan_limit(model::LayerKind::mamba2, c.mamba.state_size, c.mamba.head_dim),
                               scan_limit(model::LayerKind::gated_deltanet, c.gdn.dk, c.gdn.dv),
                               scan_limit(model::LayerKind::kda, c.kda.head_dim, c.kda.head_dim)})
    if (!r.empty()) return r;
  // Every expert is uploaded as float32 (GpuMixtureOfExperts): refuse what cannot fit the GPU.
  std::size_t free_bytes = 0, total_bytes = 0;
  if (expert_bytes > 0 && cudaMemGetInfo(&free_bytes, &total_bytes) == cudaSuccess &&
      expert_bytes > static_cast<int64_t>(free_bytes)) {
    const auto gib = [](double b) { return b / (1024.0 * 1024.0 * 1024.0); };
    return fmt::format("the mixture-of-experts layers (the first is layer {}) hold {:.2f} GiB of experts as float32 "
                       "(the GPU forward uploads every expert, dequantized, as float32), more than the {:.2f} GiB "
                       "free on the GPU; use --device cpu",
                       first_moe, gib(static_cast<double>(expert_bytes)), gib(static_cast<double>(free_bytes)));
  }
  return "";
}

GpuCausalLM::GpuCausalLM(const model::CausalLM& cpu, GemmPrecision gemm) : impl_(std::make_unique<Impl>()) {
  const std::string reason = unsupported_reason(cpu);
  if (!reason.empty()) throw std::runtime_error(fmt::format("{}: {}", cpu.directory(), reason));
  Impl& m = *impl_;
  m.dir = cpu.directory();
  m.config = cpu.config();
  m.gemm = gemm;
  REPLAYSSM_CUDA_CHECK(cudaStreamCreateWithFlags(&m.stream, cudaStreamNonBlocking));
  check_cublas(cublas_api().create(&m.cublas), "cublasCreate");
  check_cublas(cublas_api().set_stream(m.cublas, m.stream), "cublasSetStream");
  // FP32 products without TF32 (GpuLinear refuses any other mode for GemmPrecision::fp32).
  check_cublas(cublas_api().set_math_mode(m.cublas, CUBLAS_DEFAULT_MATH), "cublasSetMathMode");

  for (const auto& L : cpu.layer_blocks()) {
    Impl::Layer g;
    g.kind = L.kind;
    g.norm = upload_vec(L.norm);
    switch (L.kind) {
      case model::LayerKind::mamba2:
        g.mixer = std::make_unique<GpuMamba2Mixer>(dynamic_cast<const model::Mamba2Mixer&>(*L.mixer), gemm, m.arena);
        break;
      case model::LayerKind::gated_deltanet:
        g.mixer =
            std::make_unique<GpuGatedDeltaNet>(dynamic_cast<const model::GatedDeltaNet&>(*L.mixer), gemm, m.arena);
        break;
      case model::LayerKind::attention:
        g.mixer = std::make_unique<GpuAttention>(dynamic_cast<const model::Attention&>(*L.mixer));
        break;
      case model::LayerKind::mlp:
      case model::LayerKind::moe:
        g.mixer = position_wise_twin(*L.mixer, gemm, m.arena);
        break;
      case model::LayerKind::kda:
        g.mixer = std::make_unique<GpuKdaMixer>(dynamic_cast<const model::KdaMixer&>(*L.mixer), gemm, m.arena);
        break;
      case model::LayerKind::mla:
        g.mixer = std::make_unique<GpuMlaAttention>(dynamic_cast<const model::MlaAttention&>(*L.mixer), gemm, m.arena);
        break;
    }
    if (L.mlp) {
      g.mlp_norm = upload_vec(L.mlp_norm);
      g.mlp = position_wise_twin(*L.mlp, gemm, m.arena);
    }
    m.layers.push_back(std::move(g));
  }
  m.lm_head = GpuLinear(cpu.lm_head_weight(), model::Vec(), gemm);
  if (!m.config.tie_word_embeddings) {
    const model::Mat& e = cpu.embedding();
    m.embedding.resize(e.rows(), e.cols());
    upload(e.data(), m.embedding.view(), nullptr);
  }
  m.final_norm = upload_vec(cpu.final_norm());
  REPLAYSSM_CUDA_CHECK(cudaDeviceSynchronize());
}

GpuCausalLM::~GpuCausalLM() = default;

int GpuCausalLM::vocab_size() const { return impl_->config.vocab_size; }
int GpuCausalLM::hidden_size() const { return impl_->config.hidden_size; }
GemmPrecision GpuCausalLM::gemm_precision() const { return impl_->gemm; }
void GpuCausalLM::set_timing(bool on) { impl_->timing = on; }
const GpuForwardTiming& GpuCausalLM::last_timing() const { return impl_->last_timing; }
cudaStream_t GpuCausalLM::stream() const { return impl_->stream; }

GpuMemoryPlan GpuCausalLM::memory_plan(int64_t n) const {
  if (n < 0) throw std::invalid_argument(fmt::format("memory_plan: {} positions (expected >= 0)", n));
  const Impl& m = *impl_;
  const int64_t d = m.config.hidden_size;
  GpuMemoryPlan p;
  p.weight_bytes = m.lm_head.weight_bytes() + static_cast<int64_t>(m.embedding.buffer().bytes()) +
                   static_cast<int64_t>(m.final_norm.bytes());
  // Our blocks share the arena; their BF16 splits of x are stream-ordered allocations of one GEMM at
  // a time; attention blocks keep scratch of their own.
  int64_t transient = m.lm_head.scratch_bytes(n, m.gemm), own = 0;
  auto count = [&](const GpuBlock& b, int64_t rows) {
    p.weight_bytes += b.weight_bytes();
    const int64_t arena = arena_floats_of(b, rows);
    if (arena < 0)
      own += b.scratch_bytes(rows);
    else
      transient = std::max(transient, b.scratch_bytes(rows) - 4 * arena);
  };
  for (const Impl::Layer& L : m.layers) {
    p.weight_bytes += static_cast<int64_t>(L.norm.bytes() + L.mlp_norm.bytes());
    count(*L.mixer, position_wise(L.kind) ? std::min(n, kPositionChunk) : n);
    if (L.mlp) count(*L.mlp, std::min(n, kPositionChunk));
  }
  // The normalised copy and the block output (the residual stream is the caller's `out`), token ids.
  p.activation_bytes = 4 * 2 * n * d + 4 * n;
  p.scratch_bytes = 4 * m.arena_floats(n) + transient + own;
  p.state_bytes = 0;
  return p;
}

void GpuCausalLM::final_hidden(std::span<const int32_t> tokens, const model::PolicyAssignment& policy,
                               DeviceMatrix out,
                               const std::function<void(int layer, int n_layers, double seconds)>& on_layer_done,
                               std::optional<GemmPrecision> gemm, const GpuSequenceObserver* observe) const {
  const Impl& m = *impl_;
  const int64_t n = static_cast<int64_t>(tokens.size()), d = m.config.hidden_size;
  if (out.rows != n || out.cols != d || out.ld < d)
    throw std::invalid_argument(fmt::format("final_hidden: out is {} x {} (ld {}), expected {} x {} (tokens x hidden)",
                                            out.rows, out.cols, out.ld, n, d));
  for (int64_t i = 0; i < n; ++i)
    if (tokens[i] < 0 || tokens[i] >= m.config.vocab_size)
      throw std::invalid_argument(fmt::format("token {} at position {} is outside the vocabulary [0, {})", tokens[i], i,
                                              m.config.vocab_size));
  if (n == 0) return;
  m.token_ids.upload(tokens.data(), tokens.size(), m.stream);
  m.normed.resize(static_cast<std::size_t>(n * d));
  m.block_out.resize(static_cast<std::size_t>(n * d));
  m.arena->resize(static_cast<std::size_t>(m.arena_floats(n)));  // grown once, before any block runs
  const DeviceMatrix h = out, xn{m.normed.data(), n, d, d}, y{m.block_out.data(), n, d, d};
  // Timing (set_timing): one interval for the whole forward and one per block by kind; the GEMMs
  // inside them through a GemmTally whose category follows the block.
  GemmTally tally;
  std::optional<ScopedGemmTally> tally_scope;
  int total_id = -1;
  if (m.timing) {
    if (!m.intervals) m.intervals = std::make_unique<GpuIntervals>(kCategories);
    m.intervals->clear();  // a forward that threw may have left intervals open
    tally.intervals = m.intervals.get();
    tally_scope.emplace(&tally);
    total_id = m.intervals->begin(kTotal, m.stream);
  }
  auto timed = [&](model::LayerKind kind, const auto& run) {
    if (!m.timing) return run();
    const int category = layer_category(kind);
    tally.category = gemm_category(category);
    const int id = m.intervals->begin(category, m.stream);
    run();
    m.intervals->end(id, m.stream);
  };
  embedding_gather_gpu(m.table(), m.token_ids.data(), h, m.stream);

  const float eps = static_cast<float>(m.config.norm_eps);
  const bool plus_one = m.config.norm_plus_one;
  const int group = static_cast<int>(d);
  GpuContext ctx{m.stream, m.cublas, gemm.value_or(m.gemm), 0, nullptr, observe};
  auto whole = [&](const DeviceBuffer<float>& norm, const GpuBlock& block) {
    rms_norm_rows_gpu(h, xn, norm, eps, plus_one, group, m.stream);
    block.forward(xn, y, ctx);
    residual_add_gpu(h, y, m.stream);
  };
  auto chunked = [&](const DeviceBuffer<float>& norm, const GpuBlock& block) {
    for (int64_t r0 = 0; r0 < n; r0 += kPositionChunk) {
      const int64_t rows = std::min(kPositionChunk, n - r0);
      const DeviceMatrix hr = h.middle_rows(r0, rows), xr = xn.middle_rows(r0, rows), yr = y.middle_rows(r0, rows);
      rms_norm_rows_gpu(hr, xr, norm, eps, plus_one, group, m.stream);
      block.forward(xr, yr, ctx);
      residual_add_gpu(hr, yr, m.stream);
    }
  };
  const int n_layers = static_cast<int>(m.layers.size());
  for (int li = 0; li < n_layers; ++li) {
    const Impl::Layer& L = m.layers[li];
    ctx.layer_index = li;
    ctx.policy = &policy.for_layer(li);
    const auto start = std::chrono::steady_clock::now();
    timed(L.kind, [&] {
      if (position_wise(L.kind))
        chunked(L.norm, *L.mixer);
      else
        whole(L.norm, *L.mixer);
    });
    if (L.mlp) timed(model::LayerKind::mlp, [&] { chunked(L.mlp_norm, *L.mlp); });
    if (on_layer_done) {
      REPLAYSSM_CUDA_CHECK(cudaStreamSynchronize(m.stream));  // the time of this layer's work
      on_layer_done(li, n_layers, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    }
  }
  rms_norm_rows_gpu(h, h, m.final_norm, eps, plus_one, group, m.stream);
  if (m.timing) {
    m.intervals->end(total_id, m.stream);
    const std::vector<double> t = m.intervals->collect();  // waits for the forward
    GpuForwardTiming& r = m.last_timing;
    r = GpuForwardTiming{};
    r.total = t[kTotal];
    r.attention_layers = t[kAttentionLayers];
    r.ssm_layers = t[kSsmLayers];
    r.mlp_layers = t[kMlpLayers];
    r.attention_gemm = t[kAttentionGemm];
    r.ssm_gemm = t[kSsmGemm];
    r.mlp_gemm = t[kMlpGemm];
    r.gemm_flops = tally.flops;
    r.gemm_tensor_flops = tally.tensor_flops;
    r.gemm_calls = tally.calls;
    const model::AttentionShape& a = m.config.attention;
    const double nd = static_cast<double>(n);
    r.attention_flops = m.config.attention_layer_count() * static_cast<double>(a.num_heads) * nd * (nd + 1) * 2.0 * a.head_dim;
  }
}

void GpuCausalLM::lm_logits(ConstDeviceMatrix hidden_rows, DeviceMatrix logits,
                            std::optional<GemmPrecision> gemm) const {
  const Impl& m = *impl_;
  if (hidden_rows.cols != m.config.hidden_size || logits.cols != m.config.vocab_size ||
      logits.rows != hidden_rows.rows)
    throw std::invalid_argument(fmt::format("lm_logits: hidden rows {} x {}, logits {} x {}; expected N x {} and N x {}",
                                            hidden_rows.rows, hidden_rows.cols, logits.rows, logits.cols,
                                            m.config.hidden_size, m.config.vocab_size));
  m.lm_head.apply(hidden_rows, logits, GpuContext{m.stream, m.cublas, gemm.value_or(m.gemm), 0, nullptr});
}

}  // namespace replayssm::cuda
