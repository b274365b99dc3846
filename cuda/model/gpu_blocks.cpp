// GpuMamba2Mixer, GpuGatedDeltaNet, GpuMlp (gpu_blocks.h): host code driving cuBLAS, the model_ops
// kernels and the layer scan, step for step as Mamba2Mixer / GatedDeltaNet / Mlp::forward.
#include "model/gpu_blocks.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include <fmt/format.h>

#include "model/model_ops.h"
#include "ssm/sequence_scan.h"
#include "model/block_scratch.h"

namespace replayssm::cuda {
namespace {
using namespace block_scratch;

DeviceBuffer<float> upload_values(const float* data, std::size_t n) {
  DeviceBuffer<float> b;
  b.upload(data, n);
  REPLAYSSM_CUDA_CHECK(cudaDeviceSynchronize());  // the host values may go away
  return b;
}
DeviceBuffer<float> upload_vec(const model::Vec& v) { return upload_values(v.data(), static_cast<std::size_t>(v.size())); }
DeviceBuffer<float> upload_mat(const model::Mat& m) { return upload_values(m.data(), static_cast<std::size_t>(m.size())); }
int64_t bytes_of(const DeviceBuffer<float>& b) { return static_cast<int64_t>(b.bytes()); }

// Rows of several weights stacked (one GEMM for projections that read the same input).
model::Mat stack_rows(std::initializer_list<const model::Mat*> parts) {
  Eigen::Index rows = 0, cols = (*parts.begin())->cols();
  for (const model::Mat* p : parts) rows += p->rows();
  model::Mat m(rows, cols);
  Eigen::Index r = 0;
  for (const model::Mat* p : parts) {
    m.middleRows(r, p->rows()) = *p;
    r += p->rows();
  }
  return m;
}
model::Vec stack_bias(std::initializer_list<const model::Linear*> parts) {
  Eigen::Index n = 0;
  bool any = false;
  for (const model::Linear* p : parts) {
    n += p->out_features();
    any = any || p->bias.size();
  }
  if (!any) return {};
  model::Vec b(n);
  Eigen::Index r = 0;
  for (const model::Linear* p : parts) {
    if (p->bias.size())
      b.segment(r, p->out_features()) = p->bias;
    else
      b.segment(r, p->out_features()).setZero();
    r += p->out_features();
  }
  return b;
}


}  // namespace

// ---- Mamba-2 -------------------------------------------------------------------------------------
GpuMamba2Mixer::GpuMamba2Mixer(const model::Mamba2Mixer& cpu, GemmPrecision precision, ScratchArena arena)
    : s_(cpu.shape()),
      precision_(precision),
      in_proj_(cpu.in_proj(), precision),
      out_proj_(cpu.out_proj(), precision),
      conv_w_(upload_mat(cpu.conv_weight())),
      conv_b_(upload_vec(cpu.conv_bias())),
      dt_bias_(upload_vec(cpu.dt_bias())),
      a_log_(upload_vec(cpu.a_log())),
      d_(upload_vec(cpu.d_skip())),
      norm_w_(upload_vec(cpu.norm_weight())),
      arena_(own_if_null(std::move(arena))) {}

int64_t GpuMamba2Mixer::arena_floats(int64_t n) const {
  // proj, xBC after the conv, alpha, v, the scan's output (then y in place).
  return n * (int64_t{s_.in_proj_width()} + s_.conv_dim() + s_.num_heads + 2 * int64_t{s_.intermediate()});
}
int64_t GpuMamba2Mixer::scratch_bytes(int64_t n) const {
  return 4 * arena_floats(n) + std::max(in_proj_.scratch_bytes(n, precision_), out_proj_.scratch_bytes(n, precision_));
}
int64_t GpuMamba2Mixer::weight_bytes() const {
  return in_proj_.weight_bytes() + out_proj_.weight_bytes() + bytes_of(conv_w_) + bytes_of(conv_b_) +
         bytes_of(dt_bias_) + bytes_of(a_log_) + bytes_of(d_) + bytes_of(norm_w_);
}

void GpuMamba2Mixer::forward(ConstDeviceMatrix x, DeviceMatrix out, const GpuContext& ctx) const {
  check_io("GpuMamba2Mixer", x, out, in_proj_.in_features());
  if (!ctx.policy) throw std::invalid_argument("GpuMamba2Mixer::forward: the context has no precision policy");
  const int64_t n = x.rows;
  const int inter = s_.intermediate(), conv_dim = s_.conv_dim(), heads = s_.num_heads;
  const int dk = s_.state_size, groups = s_.n_groups;
  arena_->resize(static_cast<std::size_t>(arena_floats(n)));
  Carver c{arena_->data()};
  const DeviceMatrix proj = c.take(n, s_.in_proj_width()), xbc = c.take(n, conv_dim), alpha = c.take(n, heads),
                     v = c.take(n, inter), y = c.take(n, inter);
  in_proj_.apply(x, proj, ctx);
  causal_conv1d_silu_gpu(proj.columns(inter, conv_dim), conv_w_, s_.conv_kernel, conv_b_, xbc, ctx.stream);
  mamba2_inputs_gpu(proj.columns(inter + conv_dim, heads), xbc.columns(0, inter), dt_bias_, a_log_, s_.dt_min,
                    s_.dt_max, alpha, v, ctx.stream);

  ssm::LayerSequence seq;
  seq.kind = ssm::Recurrence::mamba2;
  seq.n_tokens = static_cast<int>(n);
  seq.dk = dk;
  seq.dv = s_.head_dim;
  seq.n_key_heads = groups;
  seq.n_value_heads = heads;
  seq.k = xbc.data + inter;  // B of group g: columns inter + g dk
  seq.ld_k = conv_dim;
  seq.q = xbc.data + inter + int64_t{groups} * dk;  // C
  seq.ld_q = conv_dim;
  seq.alpha = alpha.data;
  seq.ld_alpha = heads;
  seq.v = v.data;
  seq.ld_v = inter;
  seq.out = y.data;
  seq.ld_out = inter;
  if (ctx.observe) (*ctx.observe)(seq, *ctx.policy, static_cast<uint32_t>(ctx.layer_index), ctx.stream);
  emulate_layer_sequence_gpu(seq, *ctx.policy, static_cast<uint32_t>(ctx.layer_index), ctx.stream);

  mamba2_skip_gpu(y, xbc.columns(0, inter), d_, y, ctx.stream);
  gated_rms_norm_gpu(y, proj.columns(0, inter), norm_w_, static_cast<float>(s_.norm_eps), s_.norm_group_size, y,
                     ctx.stream);
  out_proj_.apply(y, out, ctx);
}

// ---- Gated DeltaNet --------------------------------------------------------------------------------
GpuGatedDeltaNet::GpuGatedDeltaNet(const model::GatedDeltaNet& cpu, GemmPrecision precision, ScratchArena arena)
    : s_(cpu.shape()),
      precision_(precision),
      in_proj_(stack_rows({&cpu.in_proj_qkv().weight, &cpu.in_proj_z().weight, &cpu.in_proj_b().weight,
                           &cpu.in_proj_a().weight}),
               stack_bias({&cpu.in_proj_qkv(), &cpu.in_proj_z(), &cpu.in_proj_b(), &cpu.in_proj_a()}), precision),
      out_proj_(cpu.out_proj(), precision),
      conv_w_(upload_mat(cpu.conv_weight())),
      dt_bias_(upload_vec(cpu.dt_bias())),
      a_log_(upload_vec(cpu.a_log())),
      norm_w_(upload_vec(cpu.norm_weight())),
      arena_(own_if_null(std::move(arena))) {}

int64_t GpuGatedDeltaNet::arena_floats(int64_t n) const {
  // [qkv | z | b | a], qkv after the conv, the scan's output (then y in place).
  return n * (int64_t{in_proj_.out_features()} + s_.conv_dim() + s_.value_dim());
}
int64_t GpuGatedDeltaNet::scratch_bytes(int64_t n) const {
  return 4 * arena_floats(n) + std::max(in_proj_.scratch_bytes(n, precision_), out_proj_.scratch_bytes(n, precision_));
}
int64_t GpuGatedDeltaNet::weight_bytes() const {
  return in_proj_.weight_bytes() + out_proj_.weight_bytes() + bytes_of(conv_w_) + bytes_of(dt_bias_) +
         bytes_of(a_log_) + bytes_of(norm_w_);
}

void GpuGatedDeltaNet::forward(ConstDeviceMatrix x, DeviceMatrix out, const GpuContext& ctx) const {
  check_io("GpuGatedDeltaNet", x, out, in_proj_.in_features());
  if (!ctx.policy) throw std::invalid_argument("GpuGatedDeltaNet::forward: the context has no precision policy");
  const int64_t n = x.rows;
  const int nk = s_.num_k_heads, nv = s_.num_v_heads, dk = s_.dk, dv = s_.dv;
  const int key_dim = s_.key_dim(), value_dim = s_.value_dim(), conv_dim = s_.conv_dim();
  arena_->resize(static_cast<std::size_t>(arena_floats(n)));
  Carver c{arena_->data()};
  const DeviceMatrix proj = c.take(n, in_proj_.out_features()), qkv = c.take(n, conv_dim), y = c.take(n, value_dim);
  in_proj_.apply(x, proj, ctx);
  causal_conv1d_silu_gpu(proj.columns(0, conv_dim), conv_w_, s_.conv_kernel, no_bias_, qkv, ctx.stream);
  const float q_scale = static_cast<float>(std::pow(static_cast<double>(dk), -0.5));
  l2_normalise_heads_gpu(qkv.columns(0, key_dim), dk, q_scale, qkv.columns(0, key_dim), ctx.stream);
  l2_normalise_heads_gpu(qkv.columns(key_dim, key_dim), dk, 1.0f, qkv.columns(key_dim, key_dim), ctx.stream);
  const DeviceMatrix b = proj.columns(conv_dim + value_dim, nv), a = proj.columns(conv_dim + value_dim + nv, nv);
  gdn_gates_gpu(b, a, dt_bias_, a_log_, b, a, ctx.stream);  // beta over b, alpha over a

  ssm::LayerSequence seq;
  seq.kind = ssm::Recurrence::gdn;
  seq.n_tokens = static_cast<int>(n);
  seq.dk = dk;
  seq.dv = dv;
  seq.n_key_heads = nk;
  seq.n_value_heads = nv;
  seq.q = qkv.data;
  seq.ld_q = conv_dim;
  seq.k = qkv.data + key_dim;
  seq.ld_k = conv_dim;
  seq.v = qkv.data + 2 * int64_t{key_dim};
  seq.ld_v = conv_dim;
  seq.alpha = a.data;
  seq.ld_alpha = a.ld;
  seq.beta = b.data;
  seq.ld_beta = b.ld;
  seq.out = y.data;
  seq.ld_out = value_dim;
  if (ctx.observe) (*ctx.observe)(seq, *ctx.policy, static_cast<uint32_t>(ctx.layer_index), ctx.stream);
  emulate_layer_sequence_gpu(seq, *ctx.policy, static_cast<uint32_t>(ctx.layer_index), ctx.stream);

  head_norm_gate_gpu(y, proj.columns(conv_dim, value_dim), norm_w_, static_cast<float>(s_.norm_eps), y, ctx.stream);
  out_proj_.apply(y, out, ctx);
}

// ---- MLP -------------------------------------------------------------------------------------------
namespace {
GpuLinear mlp_up(const model::Mlp& cpu, GemmPrecision precision) {
  if (cpu.shape().activation == model::MlpActivation::swiglu)
    return GpuLinear(stack_rows({&cpu.gate_proj().weight, &cpu.up_proj().weight}),
                     stack_bias({&cpu.gate_proj(), &cpu.up_proj()}), precision);
  return GpuLinear(cpu.up_proj(), precision);
}
}  // namespace

GpuMlp::GpuMlp(const model::Mlp& cpu, GemmPrecision precision, ScratchArena arena)
    : s_(cpu.shape()),
      precision_(precision),
      up_(mlp_up(cpu, precision)),
      down_(cpu.down_proj(), precision),
      arena_(own_if_null(std::move(arena))) {}

int64_t GpuMlp::arena_floats(int64_t n) const { return n * int64_t{up_.out_features()}; }
int64_t GpuMlp::scratch_bytes(int64_t n) const {
  return 4 * arena_floats(n) + std::max(up_.scratch_bytes(n, precision_), down_.scratch_bytes(n, precision_));
}
int64_t GpuMlp::weight_bytes() const { return up_.weight_bytes() + down_.weight_bytes(); }

void GpuMlp::forward(ConstDeviceMatrix x, DeviceMatrix out, const GpuContext& ctx) const {
  check_io("GpuMlp", x, out, up_.in_features());
  const int64_t n = x.rows, inter = s_.intermediate_size;
  arena_->resize(static_cast<std::size_t>(arena_floats(n)));
  const DeviceMatrix u{arena_->data(), n, up_.out_features(), up_.out_features()};
  up_.apply(x, u, ctx);
  DeviceMatrix act;
  if (s_.activation == model::MlpActivation::swiglu) {
    act = u.columns(inter, inter);  // [gate | up]: up * silu(gate), in place over up
    swiglu_gpu(u.columns(0, inter), act, act, ctx.stream);
  } else {
    act = u;
    relu2_gpu(u, u, ctx.stream);
  }
  down_.apply(act, out, ctx);
}

}  // namespace replayssm::cuda
