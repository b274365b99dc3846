// GpuKdaMixer, GpuMlaAttention, GpuMixtureOfExperts (gpu_kimi_blocks.h): host code driving cuBLAS,
// the kimi_ops / model_ops kernels, the layer scan and the GPU attention, step for step as
// KdaMixer / MlaAttention / MixtureOfExperts::forward.
#include "model/gpu_kimi_blocks.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <stdexcept>

#include <fmt/format.h>

#include "model/attention_gpu.h"
#include "model/kimi_ops.h"
#include "model/model_ops.h"
#include "ssm/sequence_scan.h"
#include "model/block_scratch.h"

namespace replayssm::cuda {
namespace {
using namespace block_scratch;

DeviceBuffer<float> upload_vec(const model::Vec& v) {
  DeviceBuffer<float> b;
  b.upload(v.data(), static_cast<std::size_t>(v.size()));
  REPLAYSSM_CUDA_CHECK(cudaDeviceSynchronize());  // the host values may go away
  return b;
}
DeviceBuffer<float> upload_mat(const model::Mat& m) {
  DeviceBuffer<float> b;
  b.upload(m.data(), static_cast<std::size_t>(m.size()));
  REPLAYSSM_CUDA_CHECK(cudaDeviceSynchronize());
  return b;
}
int64_t bytes_of(const DeviceBuffer<float>& b) { return static_cast<int64_t>(b.bytes()); }

// Several linear layers that read the same input as one (their weights' rows stacked, biases too:
// zeros for a part without one, none when no part has one): one GEMM, the same products per output.
GpuLinear stacked(std::initializer_list<const model::Linear*> parts, GemmPrecision precision) {
  Eigen::Index rows = 0;
  const Eigen::Index cols = (*parts.begin())->weight.cols();
  bool any_bias = false;
  for (const model::Linear* p : parts) {
    if (p->weight.cols() != cols)
      throw std::logic_error(fmt::format("stacked: a part reads {} features, another {}", p->weight.cols(), cols));
    rows += p->weight.rows();
    any_bias = any_bias || p->bias.size() != 0;
  }
  model::Mat w(rows, cols);
  model::Vec b = any_bias ? model::Vec(model::Vec::Zero(rows)) : model::Vec();
  Eigen::Index r = 0;
  for (const model::Linear* p : parts) {
    w.middleRows(r, p->weight.rows()) = p->weight;
    if (p->bias.size()) b.segment(r, p->weight.rows()) = p->bias;
    r += p->weight.rows();
  }
  return GpuLinear(w, b, precision);
}


int64_t max_linear_scratch(std::initializer_list<const GpuLinear*> linears, int64_t rows, GemmPrecision p) {
  int64_t s = 0;
  for (const GpuLinear* l : linears) s = std::max(s, l->scratch_bytes(rows, p));
  return s;
}

}  // namespace

// ---- Kimi Delta Attention --------------------------------------------------------------------------
GpuKdaMixer::GpuKdaMixer(const model::KdaMixer& cpu, GemmPrecision precision, ScratchArena arena)
    : s_(cpu.shape()),
      precision_(precision),
      in_proj_(stacked({&cpu.q_proj(), &cpu.k_proj(), &cpu.v_proj(), &cpu.f_a_proj(), &cpu.g_a_proj(), &cpu.b_proj()},
                       precision)),
      f_b_(cpu.f_b_proj(), precision),
      g_b_(cpu.g_b_proj(), precision),
      o_proj_(cpu.o_proj(), precision),
      conv_w_(upload_mat(cpu.conv_weight())),
      dt_bias_(upload_vec(cpu.dt_bias())),
      a_log_(upload_vec(cpu.a_log())),
      norm_w_(upload_vec(cpu.norm_weight())),
      arena_(own_if_null(std::move(arena))) {
  if (s_.head_dim > kScanMaxDk)
    throw std::invalid_argument(
        fmt::format("GpuKdaMixer: head_dim {} exceeds the GPU scan's limit {}", s_.head_dim, kScanMaxDk));
}

int64_t GpuKdaMixer::arena_floats(int64_t n) const {
  // The stacked projections, [q | k | v] after the conv, the decay (then alpha in place), the
  // output gate, the scan's output (then the normed output in place).
  return n * (int64_t{in_proj_.out_features()} + s_.conv_dim() + 3 * int64_t{s_.qkv_dim()});
}
int64_t GpuKdaMixer::scratch_bytes(int64_t n) const {
  return 4 * arena_floats(n) + max_linear_scratch({&in_proj_, &f_b_, &g_b_, &o_proj_}, n, precision_);
}
int64_t GpuKdaMixer::weight_bytes() const {
  return in_proj_.weight_bytes() + f_b_.weight_bytes() + g_b_.weight_bytes() + o_proj_.weight_bytes() +
         bytes_of(conv_w_) + bytes_of(dt_bias_) + bytes_of(a_log_) + bytes_of(norm_w_);
}

void GpuKdaMixer::forward(ConstDeviceMatrix x, DeviceMatrix out, const GpuContext& ctx) const {
  check_io("GpuKdaMixer", x, out, in_proj_.in_features());
  if (!ctx.policy) throw std::invalid_argument("GpuKdaMixer::forward: the context has no precision policy");
  const int64_t n = x.rows;
  if (n == 0) return;
  const int heads = s_.num_heads, d = s_.head_dim, qkv = s_.qkv_dim(), conv_dim = s_.conv_dim();
  arena_->resize(static_cast<std::size_t>(arena_floats(n)));
  Carver c{arena_->data()};
  const DeviceMatrix proj = c.take(n, in_proj_.out_features()), mixed = c.take(n, conv_dim),
                     decay = c.take(n, qkv), gate = c.take(n, qkv), y = c.take(n, qkv);
  in_proj_.apply(x, proj, ctx);
  causal_conv1d_silu_gpu(proj.columns(0, conv_dim), conv_w_, s_.conv_kernel, no_bias_, mixed, ctx.stream);
  // KdaMixer::forward: q_scale = 1 / sqrt(d) in double, rounded to float.
  const float q_scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(d)));
  kda_l2_normalise_heads_gpu(mixed.columns(0, qkv), d, q_scale, mixed.columns(0, qkv), ctx.stream);
  kda_l2_normalise_heads_gpu(mixed.columns(qkv, qkv), d, 1.0f, mixed.columns(qkv, qkv), ctx.stream);
  const DeviceMatrix f_low = proj.columns(conv_dim, d), g_low = proj.columns(conv_dim + d, d),
                     beta = proj.columns(conv_dim + 2 * int64_t{d}, heads);
  f_b_.apply(f_low, decay, ctx);
  g_b_.apply(g_low, gate, ctx);
  kda_gates_gpu(decay, beta, dt_bias_, a_log_, decay, beta, ctx.stream);  // alpha over decay, beta over b

  ssm::LayerSequence seq;
  seq.kind = ssm::Recurrence::kda;
  seq.n_tokens = static_cast<int>(n);
  seq.dk = d;
  seq.dv = d;
  seq.n_key_heads = heads;  // each head its own key head
  seq.n_value_heads = heads;
  seq.q = mixed.data;
  seq.ld_q = conv_dim;
  seq.k = mixed.data + qkv;
  seq.ld_k = conv_dim;
  seq.v = mixed.data + 2 * int64_t{qkv};
  seq.ld_v = conv_dim;
  seq.alpha = decay.data;  // head h's dk channels at columns h d
  seq.ld_alpha = qkv;
  seq.beta = beta.data;
  seq.ld_beta = beta.ld;
  seq.out = y.data;
  seq.ld_out = qkv;
  if (ctx.observe) (*ctx.observe)(seq, *ctx.policy, static_cast<uint32_t>(ctx.layer_index), ctx.stream);
  emulate_layer_sequence_gpu(seq, *ctx.policy, static_cast<uint32_t>(ctx.layer_index), ctx.stream);

  kda_head_norm_gate_gpu(y, gate, norm_w_, static_cast<float>(s_.norm_eps), y, ctx.stream);
  o_proj_.apply(y, out, ctx);
}

// ---- multi-head latent attention -----------------------------------------------------------------
namespace {
GpuLinear mla_first(const model::MlaAttention& cpu, GemmPrecision precision) {
  const model::Linear& q = cpu.shape().q_lora_rank == 0 ? cpu.q_proj() : cpu.q_a_proj();
  return stacked({&q, &cpu.kv_a_proj()}, precision);
}
}  // namespace

GpuMlaAttention::GpuMlaAttention(const model::MlaAttention& cpu, GemmPrecision precision, ScratchArena arena)
    : s_(cpu.shape()),
      precision_(precision),
      in_proj_(mla_first(cpu, precision)),
      kv_b_(cpu.kv_b_proj(), precision),
      o_proj_(cpu.o_proj(), precision),
      kv_a_norm_(upload_vec(cpu.kv_a_norm())),
      arena_(own_if_null(std::move(arena))) {
  if (s_.q_lora_rank > 0) {
    q_b_ = GpuLinear(cpu.q_b_proj(), precision);
    q_a_norm_ = upload_vec(cpu.q_a_norm());
  }
  // causal_attention_gpu's limits, checked now rather than at the first forward.
  if (s_.qk_head_dim() > 256 || s_.v_head_dim > 256)
    throw std::invalid_argument(fmt::format("GpuMlaAttention: qk_head_dim {} and v_head_dim {} must be <= 256",
                                            s_.qk_head_dim(), s_.v_head_dim));
}

int GpuMlaAttention::first_width() const {
  return (s_.q_lora_rank ? s_.q_lora_rank : s_.q_width()) + s_.kv_a_width();
}

int64_t GpuMlaAttention::arena_floats(int64_t n) const {
  // [q or q_a | c | k_rope], q (q_lora_rank > 0), [k_nope | v] per head, k, v, the attention output.
  const int64_t q = s_.q_lora_rank ? s_.q_width() : 0;
  return n * (int64_t{first_width()} + q + s_.kv_b_width() + s_.q_width() + 2 * int64_t{s_.value_width()});
}
int64_t GpuMlaAttention::scratch_bytes(int64_t n) const {
  return 4 * arena_floats(n) + max_linear_scratch({&in_proj_, &q_b_, &kv_b_, &o_proj_}, n, precision_);
}
int64_t GpuMlaAttention::weight_bytes() const {
  return in_proj_.weight_bytes() + q_b_.weight_bytes() + kv_b_.weight_bytes() + o_proj_.weight_bytes() +
         bytes_of(q_a_norm_) + bytes_of(kv_a_norm_);
}

void GpuMlaAttention::forward(ConstDeviceMatrix x, DeviceMatrix out, const GpuContext& ctx) const {
  check_io("GpuMlaAttention", x, out, in_proj_.in_features());
  const int64_t n = x.rows;
  if (n == 0) return;
  const int H = s_.num_heads, nope = s_.qk_nope_head_dim, rope = s_.qk_rope_head_dim, dv = s_.v_head_dim;
  const int qk = s_.qk_head_dim(), rank = s_.kv_lora_rank, q_first = s_.q_lora_rank ? s_.q_lora_rank : s_.q_width();
  const float lora_eps = static_cast<float>(s_.lora_norm_eps);
  arena_->resize(static_cast<std::size_t>(arena_floats(n)));
  Carver c{arena_->data()};
  const DeviceMatrix proj = c.take(n, first_width());
  in_proj_.apply(x, proj, ctx);
  DeviceMatrix q = proj.columns(0, q_first);
  if (s_.q_lora_rank) {
    rms_norm_rows_gpu(q, q, q_a_norm_, lora_eps, false, s_.q_lora_rank, ctx.stream);
    const DeviceMatrix qb = c.take(n, s_.q_width());
    q_b_.apply(q, qb, ctx);
    q = qb;
  }
  // The latent [c | k_rope]: c normalised (in place: the raw c is not needed again) and expanded.
  const DeviceMatrix latent = proj.columns(q_first, s_.kv_a_width());
  const DeviceMatrix lat_c = latent.columns(0, rank);
  rms_norm_rows_gpu(lat_c, lat_c, kv_a_norm_, lora_eps, false, rank, ctx.stream);
  const DeviceMatrix kvb = c.take(n, s_.kv_b_width()), k = c.take(n, s_.q_width()), v = c.take(n, s_.value_width()),
                     att = c.take(n, s_.value_width());
  kv_b_.apply(lat_c, kvb, ctx);
  mla_assemble_kv_gpu(kvb, latent.columns(rank, rope), H, nope, dv, k, v, ctx.stream);
  // MlaAttention::forward: qk_head_dim^-1/2 in double, applied to the scores.
  const float scale = static_cast<float>(std::pow(static_cast<double>(qk), -0.5));
  causal_attention_gpu(q, k, v, {H, H, qk, dv}, scale, model::ScaleAt::scores, att, ctx.stream);
  o_proj_.apply(att, out, ctx);
}

// ---- mixture of experts ----------------------------------------------------------------------------
namespace {
int64_t expert_input_width(const model::MoeShape& s, int hidden) { return s.latent_size ? s.latent_size : hidden; }
int64_t up_width(const model::MoeShape& s) {
  return (s.activation == model::ExpertActivation::swiglu ? 2 : 1) * int64_t{s.expert_intermediate};
}
}  // namespace

int64_t GpuMixtureOfExperts::expert_weight_bytes(const model::MoeShape& s, int hidden) {
  const int64_t matrices = s.activation == model::ExpertActivation::swiglu ? 3 : 2;
  return 4 * int64_t{s.router.n_experts} * matrices * s.expert_intermediate * expert_input_width(s, hidden);
}

GpuMixtureOfExperts::GpuMixtureOfExperts(const model::MixtureOfExperts& cpu, GemmPrecision precision,
                                         ScratchArena arena)
    : s_(cpu.shape()),
      hidden_(cpu.hidden()),
      precision_(precision),
      router_(cpu.router(), precision),
      correction_bias_(cpu.correction_bias()),
      arena_(own_if_null(std::move(arena))) {
  const bool swiglu = s_.activation == model::ExpertActivation::swiglu;
  if (s_.latent_size) {
    latent_in_ = GpuLinear(cpu.latent_in(), precision);
    latent_out_ = GpuLinear(cpu.latent_out(), precision);
  }
  if (cpu.shared_expert()) {
    shared_ = std::make_unique<GpuMlp>(*cpu.shared_expert(), precision, arena_);
    if (s_.shared_gate) shared_gate_ = GpuLinear(cpu.shared_expert_gate(), precision);
  }
  const int n_exp = s_.router.n_experts;
  if (cpu.up_experts().count() != n_exp || cpu.down_experts().count() != n_exp ||
      (swiglu && cpu.gate_experts().count() != n_exp))
    throw std::logic_error(fmt::format("GpuMixtureOfExperts: {} up, {} down, {} gate matrices for {} experts",
                                       cpu.up_experts().count(), cpu.down_experts().count(),
                                       cpu.gate_experts().count(), n_exp));
  // Each expert's matrices as float32 (StoredMatrix::fetch: the values the CPU's forward reads).
  std::vector<float> up_buffer, gate_buffer, down_buffer;
  experts_.reserve(static_cast<std::size_t>(n_exp));
  for (int e = 0; e < n_exp; ++e) {
    const Eigen::Map<const model::Mat> up = cpu.up_experts().fetch(e, up_buffer);
    const Eigen::Map<const model::Mat> down = cpu.down_experts().fetch(e, down_buffer);
    Expert x;
    if (swiglu) {
      const Eigen::Map<const model::Mat> gate = cpu.gate_experts().fetch(e, gate_buffer);
      model::Mat gu(gate.rows() + up.rows(), up.cols());
      gu.topRows(gate.rows()) = gate;
      gu.bottomRows(up.rows()) = up;
      x.up = GpuLinear(gu, model::Vec(), precision);
    } else {
      x.up = GpuLinear(model::Mat(up), model::Vec(), precision);
    }
    x.down = GpuLinear(model::Mat(down), model::Vec(), precision);
    experts_.push_back(std::move(x));
  }
}

int64_t GpuMixtureOfExperts::arena_floats(int64_t n) const {
  // Router logits, the shared gate's logit, the latent input, the gathered rows (rows x top_k of
  // them), their up (and gate) products and expert outputs, the routed sum, and with a latent and a
  // shared expert fc2_latent's output; the shared expert's MLP runs first, in the same arena.
  const int64_t k = s_.router.top_k, in = expert_input_width(s_, hidden_);
  const int64_t mine = n * (int64_t{s_.router.n_experts} + (shared_ && s_.shared_gate ? 1 : 0) + (s_.latent_size ? in : 0) +
                            k * (2 * in + up_width(s_)) + ((s_.latent_size || shared_) ? in : 0) +
                            (s_.latent_size && shared_ ? hidden_ : 0));
  return std::max(mine, shared_ ? shared_->arena_floats(n) : 0);
}
int64_t GpuMixtureOfExperts::scratch_bytes(int64_t n) const {
  int64_t linear = std::max(max_linear_scratch({&router_, &shared_gate_, &latent_in_, &latent_out_}, n, precision_),
                            shared_ ? shared_->scratch_bytes(n) - 4 * shared_->arena_floats(n) : 0);
  const int64_t slots = n * s_.router.top_k;
  for (const Expert& e : experts_)
    linear = std::max({linear, e.up.scratch_bytes(slots, precision_), e.down.scratch_bytes(slots, precision_)});
  // + the routing indices and weights on the device.
  return 4 * arena_floats(n) + linear + 3 * 4 * slots;
}
int64_t GpuMixtureOfExperts::weight_bytes() const {
  int64_t b = router_.weight_bytes() + shared_gate_.weight_bytes() + latent_in_.weight_bytes() +
              latent_out_.weight_bytes() + (shared_ ? shared_->weight_bytes() : 0);
  for (const Expert& e : experts_) b += e.up.weight_bytes() + e.down.weight_bytes();
  return b;
}

model::Routing GpuMixtureOfExperts::route_into(ConstDeviceMatrix x, DeviceMatrix logits, const GpuContext& ctx) const {
  const int64_t n = x.rows, n_exp = s_.router.n_experts;
  router_.apply(x, logits, ctx);
  host_logits_.resize(static_cast<std::size_t>(n * n_exp));
  REPLAYSSM_CUDA_CHECK(cudaMemcpy2DAsync(host_logits_.data(), static_cast<std::size_t>(n_exp) * 4, logits.data,
                                         static_cast<std::size_t>(logits.ld) * 4, static_cast<std::size_t>(n_exp) * 4,
                                         static_cast<std::size_t>(n), cudaMemcpyDeviceToHost, ctx.stream));
  REPLAYSSM_CUDA_CHECK(cudaStreamSynchronize(ctx.stream));
  return model::route(Eigen::Map<const model::Mat>(host_logits_.data(), n, n_exp), s_.router, correction_bias_);
}

model::Routing GpuMixtureOfExperts::route(ConstDeviceMatrix x, const GpuContext& ctx) const {
  if (x.cols != hidden_)
    throw std::invalid_argument(
        fmt::format("GpuMixtureOfExperts::route: x is {} x {}, expected N x {}", x.rows, x.cols, hidden_));
  DeviceBuffer<float> logits(static_cast<std::size_t>(x.rows * s_.router.n_experts));
  return route_into(x, DeviceMatrix{logits.data(), x.rows, s_.router.n_experts, s_.router.n_experts}, ctx);
}

void GpuMixtureOfExperts::forward(ConstDeviceMatrix x, DeviceMatrix out, const GpuContext& ctx) const {
  check_io("GpuMixtureOfExperts", x, out, hidden_);
  const int64_t n = x.rows;
  if (n == 0) return;
  const int k = s_.router.top_k, n_exp = s_.router.n_experts;
  const int64_t in = expert_input_width(s_, hidden_), slots = n * k, inter = s_.expert_intermediate;
  if (slots > INT_MAX)
    throw std::invalid_argument(fmt::format("GpuMixtureOfExperts::forward: {} rows x top_k {} slots exceed 2^31 - 1 "
                                            "(the position-wise chunks are 2048 rows)", n, k));
  arena_->resize(static_cast<std::size_t>(arena_floats(n)));
  // The shared expert first, straight into `out` (its MLP scratch is the arena's start, free again
  // once it has run: the carving below reuses it in stream order).
  if (shared_) shared_->forward(x, out, ctx);

  Carver c{arena_->data()};
  const DeviceMatrix logits = c.take(n, n_exp);
  const bool gated = shared_ && s_.shared_gate;
  const DeviceMatrix gate = gated ? c.take(n, 1) : DeviceMatrix{};
  if (gated) shared_gate_.apply(x, gate, ctx);
  const model::Routing routing = route_into(x, logits, ctx);

  // Slots grouped by expert, ascending expert then ascending slot (the CPU's order of rows per
  // expert); gathered row p holds slot order[p].
  std::vector<int64_t> first(static_cast<std::size_t>(n_exp) + 1, 0);
  for (const int e : routing.expert) ++first[static_cast<std::size_t>(e) + 1];
  for (int e = 0; e < n_exp; ++e) first[static_cast<std::size_t>(e) + 1] += first[static_cast<std::size_t>(e)];
  host_slot_row_.resize(static_cast<std::size_t>(slots));
  host_source_row_.resize(static_cast<std::size_t>(slots));
  host_slot_weight_.assign(routing.weight.begin(), routing.weight.end());
  {
    std::vector<int64_t> next(first.begin(), first.end() - 1);
    for (int64_t s = 0; s < slots; ++s) {
      const int64_t p = next[static_cast<std::size_t>(routing.expert[static_cast<std::size_t>(s)])]++;
      host_slot_row_[static_cast<std::size_t>(s)] = static_cast<int32_t>(p);
      host_source_row_[static_cast<std::size_t>(p)] = static_cast<int32_t>(s / k);
    }
  }
  slot_row_.upload(host_slot_row_, ctx.stream);
  source_row_.upload(host_source_row_, ctx.stream);
  slot_weight_.upload(host_slot_weight_, ctx.stream);

  ConstDeviceMatrix z = x;
  if (s_.latent_size) {
    const DeviceMatrix latent = c.take(n, in);
    latent_in_.apply(x, latent, ctx);
    z = latent;
  }
  const DeviceMatrix rows_in = c.take(slots, in), h = c.take(slots, up_width(s_)), y = c.take(slots, in);
  embedding_gather_gpu(z, source_row_.data(), rows_in, ctx.stream);
  for (int e = 0; e < n_exp; ++e) {
    const int64_t r0 = first[static_cast<std::size_t>(e)], rows = first[static_cast<std::size_t>(e) + 1] - r0;
    if (rows > 0) experts_[static_cast<std::size_t>(e)].up.apply(rows_in.middle_rows(r0, rows), h.middle_rows(r0, rows), ctx);
  }
  DeviceMatrix act = h;
  if (s_.activation == model::ExpertActivation::swiglu) {
    act = h.columns(inter, inter);  // [gate | up]: up * silu(gate), in place over up
    swiglu_gpu(h.columns(0, inter), act, act, ctx.stream);
  } else {
    relu2_gpu(h, h, ctx.stream);
  }
  for (int e = 0; e < n_exp; ++e) {
    const int64_t r0 = first[static_cast<std::size_t>(e)], rows = first[static_cast<std::size_t>(e) + 1] - r0;
    if (rows > 0) experts_[static_cast<std::size_t>(e)].down.apply(act.middle_rows(r0, rows), y.middle_rows(r0, rows), ctx);
  }
  // out = routed (through fc2_latent) [+ the shared expert's term, which `out` holds now].
  const DeviceMatrix routed = (s_.latent_size || shared_) ? c.take(n, in) : out;
  moe_weighted_sum_gpu(y, slot_row_.data(), slot_weight_.data(), k, routed, ctx.stream);
  DeviceMatrix base = routed;
  if (s_.latent_size) {
    base = shared_ ? c.take(n, hidden_) : out;
    latent_out_.apply(routed, base, ctx);
  }
  if (shared_) moe_add_shared_gpu(base, out, gate, out, ctx.stream);
}

}  // namespace replayssm::cuda
