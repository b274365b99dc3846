// The GPU twins of Kimi Linear's blocks and of the mixture of experts (cuda/model/kimi_ops.h,
// gpu_kimi_blocks.h) against their CPU twins:
//   ops      each kimi_ops op vs its CPU twin on fresh random inputs (fixed seeds, never all zeros),
//            awkward shapes (1 row, widths not multiples of 32, strided column blocks whose
//            neighbouring columns must come back untouched): |gpu - cpu| <= 1e-6 (rms + |cpu|) (expf
//            and logf within 1-2 ulp of glibc's; sums of squares in double on both sides); the copies
//            and the MoE sums, which have no transcendental, exactly
//   blocks   GpuKdaMixer, GpuMlaAttention, GpuMixtureOfExperts (and GpuMlp) built from the blocks of
//            the golden models (kimi_linear_tiny, nemotron_h_moe_tiny, qwen3_5_moe_tiny) and of
//            variants made here (MLA with a low-rank query and biases; MoE with a latent projection;
//            the fused expert layout) vs the CPU block's forward on random inputs, FP32 policies:
//            1e-5 (rms + |cpu|) (the GEMMs' summation order differs); the GPU's routing picks the
//            CPU's experts; the variants' whole-model log-probs within 1e-5 (1 + |cpu|) of the CPU's
//   memory   the experts' device bytes follow GpuMixtureOfExperts::expert_weight_bytes
// Skips (77) without a GPU.
#include <doctest/doctest.h>

#include <boost/random/mersenne_twister.hpp>
#include <boost/random/normal_distribution.hpp>
#include <boost/random/uniform_int_distribution.hpp>
#include <boost/random/uniform_real_distribution.hpp>
#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "cuda_check.h"
#include "model/causal_lm.h"
#include "model/gpu_causal_lm.h"
#include "model/gpu_kimi_blocks.h"
#include "model/kimi_ops.h"
#include "model/moe.h"
#include "../model/test_model_util.h"
#include "model/cublas_api.h"
#include "gpu_test_util.h"

using namespace replayssm;
using namespace replayssm::cuda;
using model::Mat;
using model::Vec;
namespace fs = std::filesystem;

namespace {

const test::GpuGuard gpu_guard("Kimi Linear / MoE GPU block tests");

struct Rng {
  boost::random::mt19937_64 gen;
  explicit Rng(uint64_t salt) : gen(test::kBaseSeed + salt) {}
  Mat normal(Eigen::Index rows, Eigen::Index cols, float scale = 1.0f) {
    boost::random::normal_distribution<float> d(0.0f, scale);
    Mat m(rows, cols);
    for (Eigen::Index i = 0; i < m.size(); ++i) m.data()[i] = d(gen);
    return m;
  }
  Vec vec(Eigen::Index n, float lo, float hi) {
    boost::random::uniform_real_distribution<float> d(lo, hi);
    Vec v(n);
    for (Eigen::Index i = 0; i < n; ++i) v[i] = d(gen);
    return v;
  }
  int uniform_int(int lo, int hi) { return boost::random::uniform_int_distribution<int>(lo, hi)(gen); }
};

DeviceBuffer<float> dev(const Vec& v) {
  DeviceBuffer<float> b;
  b.upload(v.data(), static_cast<std::size_t>(v.size()));
  REPLAYSSM_CUDA_CHECK(cudaDeviceSynchronize());
  return b;
}

// A random host matrix `rows x (left + cols + right)` and its device copy; the op works on the column
// block [left, left + cols). Comparing the whole matrices also checks the columns around the block.
struct Wide {
  Mat host;
  DeviceMatrixBuffer device;
  Eigen::Index left, cols;
  Wide(Rng& rng, Eigen::Index rows, Eigen::Index cols_, Eigen::Index left_ = 0, Eigen::Index right = 0,
       float scale = 1.0f)
      : host(rng.normal(rows, left_ + cols_ + right, scale)), left(left_), cols(cols_) {
    sync();
  }
  void sync() {
    device.resize(host.rows(), host.cols());
    upload(host.data(), device.view());
    REPLAYSSM_CUDA_CHECK(cudaDeviceSynchronize());
  }
  MatRef cpu() { return host.middleCols(left, cols); }
  ConstMatRef ccpu() const { return host.middleCols(left, cols); }
  DeviceMatrix gpu() { return device.view().columns(left, cols); }
  std::vector<float> back() const {
    REPLAYSSM_CUDA_CHECK(cudaDeviceSynchronize());
    return to_host(device.view());
  }
  std::vector<float> ref() const { return std::vector<float>(host.data(), host.data() + host.size()); }
};

test::Closeness compare(const Wide& w, double rtol, const std::string& what) {
  const std::vector<float> got = w.back(), ref = w.ref();
  const double scale = test::rms(ref.data(), ref.size());
  return test::compare_close(got, ref, {rtol * scale, rtol}, what);
}
test::Closeness exact(const Wide& w, const std::string& what) { return test::compare_close(w.back(), w.ref(), {0, 0}, what); }

constexpr double kOpTol = 1e-6, kBlockTol = 1e-5;

}  // namespace

// ---- ops ---------------------------------------------------------------------------------------------
TEST_CASE("KDA ops: L2 normalisation by division (q scaled), channel-wise gates, sigmoid-gated per-head norm") {
  Rng rng(101);
  for (const int rows : {1, 129}) {
    for (const int d : {24, 64, 128, 256}) {
      CAPTURE(rows); CAPTURE(d);
      Wide qk(rng, rows, 2 * d, 0, 2 * d, 2.0f);  // q and k inside [q | k | v]
      const float q_scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(d)));
      kda_l2_normalise_heads_gpu(qk.gpu().columns(0, d), d, q_scale, qk.gpu().columns(0, d), nullptr);
      kda_l2_normalise_heads(qk.ccpu().middleCols(0, d), d, q_scale, qk.cpu().middleCols(0, d));
      kda_l2_normalise_heads_gpu(qk.gpu().columns(d, d), d, 1.0f, qk.gpu().columns(d, d), nullptr);
      kda_l2_normalise_heads(qk.ccpu().middleCols(d, d), d, 1.0f, qk.cpu().middleCols(d, d));
      CHECK_CLOSE(compare(qk, kOpTol, "kda_l2_normalise_heads (in place)"));
      Wide x(rng, rows, 3 * d, 5, 0), out(rng, rows, 3 * d, 0, 3);  // three heads, out of place
      kda_l2_normalise_heads_gpu(x.gpu(), d, q_scale, out.gpu(), nullptr);
      kda_l2_normalise_heads(x.ccpu(), d, q_scale, out.cpu());
      CHECK_CLOSE(compare(out, kOpTol, "kda_l2_normalise_heads"));
    }
    for (const int heads : {1, 3}) {
      for (const int d : {8, 128}) {
        CAPTURE(rows); CAPTURE(heads); CAPTURE(d);
        const int width = heads * d;
        Wide decay(rng, rows, width, 2, 3, 4.0f);  // f_b's output
        decay.host(0, 2) = 30.0f;                   // softplus' linear branch
        decay.host(rows - 1, 2 + width - 1) = -30.0f;
        decay.sync();
        Wide b(rng, rows, heads, 7, 1, 3.0f);  // b_proj's columns at the end of the stacked projection
        Wide alpha(rng, rows, width, 1, 0);
        const Vec dt_bias = rng.vec(width, -1.0f, 1.0f), a_log = rng.vec(heads, -1.0f, 1.5f);
        kda_gates_gpu(decay.gpu(), b.gpu(), dev(dt_bias), dev(a_log), alpha.gpu(), b.gpu(), nullptr);
        kda_gates(decay.ccpu(), b.ccpu(), dt_bias, a_log, alpha.cpu(), b.cpu());
        CHECK_CLOSE(compare(alpha, kOpTol, "kda_gates alpha"));
        CHECK_CLOSE(compare(b, kOpTol, "kda_gates beta (in place over b)"));
        CHECK_CLOSE(exact(decay, "kda_gates leaves decay as it was"));
        // alpha in place over decay, as GpuKdaMixer runs it.
        Wide b2(rng, rows, heads, 0, 0, 3.0f);
        kda_gates_gpu(decay.gpu(), b2.gpu(), dev(dt_bias), dev(a_log), decay.gpu(), b2.gpu(), nullptr);
        kda_gates(decay.ccpu(), b2.ccpu(), dt_bias, a_log, decay.cpu(), b2.cpu());
        CHECK_CLOSE(compare(decay, kOpTol, "kda_gates alpha in place over decay"));
      }
    }
    for (const int d : {16, 100, 128}) {
      CAPTURE(rows); CAPTURE(d);
      Wide o(rng, rows, 3 * d, 4, 0, 0.3f), gate(rng, rows, 3 * d, 0, 6, 2.0f);
      const Vec w = rng.vec(d, 0.5f, 1.5f);
      kda_head_norm_gate_gpu(o.gpu(), gate.gpu(), dev(w), 1e-5f, o.gpu(), nullptr);
      kda_head_norm_gate(o.ccpu(), gate.ccpu(), w, 1e-5f, o.cpu());
      CHECK_CLOSE(compare(o, kOpTol, "kda_head_norm_gate (in place)"));
    }
  }
  Wide x(rng, 4, 100);
  CHECK_THROWS_AS(kda_l2_normalise_heads_gpu(x.gpu(), 30, 1.0f, x.gpu(), nullptr), std::invalid_argument);
  CHECK_THROWS_AS(kda_head_norm_gate_gpu(x.gpu(), x.gpu(), dev(Vec(Vec::Ones(30))), 1e-5f, x.gpu(), nullptr),
                  std::invalid_argument);
  Wide b(rng, 4, 3);
  CHECK_THROWS_AS(kda_gates_gpu(x.gpu(), b.gpu(), dev(Vec(Vec::Zero(99))), dev(Vec(Vec::Zero(2))), x.gpu(), b.gpu(),
                                nullptr),
                  std::invalid_argument);  // dt_bias is one short
}

TEST_CASE("mla_assemble_kv_gpu copies what its twin copies: per-head [k_nope | shared k_rope] and v") {
  Rng rng(102);
  for (const int rows : {1, 100}) {
    for (const int heads : {1, 2, 5}) {
      for (const std::array<int, 3>& dims : {std::array{16, 8, 16}, std::array{128, 64, 128}, std::array{7, 3, 5}}) {
        const int nope = dims[0], rope = dims[1], dv = dims[2];
        CAPTURE(rows); CAPTURE(heads); CAPTURE(nope); CAPTURE(rope); CAPTURE(dv);
        Wide kvb(rng, rows, heads * (nope + dv), 0, 2);
        Wide latent(rng, rows, rope, 11, 0);  // k_rope: the latent's last columns
        Wide k(rng, rows, heads * (nope + rope), 1, 1), v(rng, rows, heads * dv, 0, 4);
        mla_assemble_kv_gpu(kvb.gpu(), latent.gpu(), heads, nope, dv, k.gpu(), v.gpu(), nullptr);
        mla_assemble_kv(kvb.ccpu(), latent.ccpu(), heads, nope, dv, k.cpu(), v.cpu());
        CHECK_CLOSE(exact(k, "mla_assemble_kv k"));
        CHECK_CLOSE(exact(v, "mla_assemble_kv v"));
      }
    }
  }
  Rng r2(103);
  Wide kvb(r2, 4, 2 * 32), rope(r2, 4, 8), k(r2, 4, 2 * 24), bad_v(r2, 4, 2 * 15);
  CHECK_THROWS_AS(mla_assemble_kv_gpu(kvb.gpu(), rope.gpu(), 2, 16, 16, k.gpu(), bad_v.gpu(), nullptr),
                  std::invalid_argument);
}

TEST_CASE("MoE ops: the weighted sum in ascending slot order, the (gated) shared term; bad slot rows refused") {
  Rng rng(104);
  for (const int rows : {1, 100}) {
    for (const int top_k : {1, 2, 8}) {
      CAPTURE(rows); CAPTURE(top_k);
      const int slots = rows * top_k, width = 45;
      Wide y(rng, slots, width, 3, 2, 2.0f);
      // A random permutation: slot s is held by row slot_row[s] of y (the experts' order).
      std::vector<int32_t> slot_row(static_cast<std::size_t>(slots));
      std::iota(slot_row.begin(), slot_row.end(), 0);
      std::shuffle(slot_row.begin(), slot_row.end(), std::mt19937(static_cast<unsigned>(rows * 31 + top_k)));
      const Vec w = rng.vec(slots, 0.01f, 2.5f);
      const std::vector<float> weights(w.data(), w.data() + w.size());
      DeviceBuffer<int32_t> d_rows;
      d_rows.upload(slot_row);
      DeviceBuffer<float> d_weights;
      d_weights.upload(weights);
      Wide out(rng, rows, width, 2, 5);
      moe_weighted_sum_gpu(y.gpu(), d_rows.data(), d_weights.data(), top_k, out.gpu(), nullptr);
      moe_weighted_sum(y.ccpu(), slot_row, weights, top_k, out.cpu());
      CHECK_CLOSE(exact(out, "moe_weighted_sum"));

      Wide shared(rng, rows, width, 0, 1), gate(rng, rows, 1, 4, 0, 3.0f), routed(rng, rows, width, 6, 0);
      for (const bool gated : {true, false}) {
        CAPTURE(gated);
        Wide res(rng, rows, width, 1, 2);
        const ConstDeviceMatrix g = gated ? ConstDeviceMatrix(gate.gpu()) : ConstDeviceMatrix();
        const Mat none(rows, 0);
        moe_add_shared_gpu(routed.gpu(), shared.gpu(), g, res.gpu(), nullptr);
        moe_add_shared(routed.ccpu(), shared.ccpu(), gated ? gate.ccpu() : ConstMatRef(none), res.cpu());
        CHECK_CLOSE(compare(res, kOpTol, "moe_add_shared"));
      }
      // In place over the shared rows, as GpuMixtureOfExperts runs it.
      moe_add_shared_gpu(routed.gpu(), shared.gpu(), gate.gpu(), shared.gpu(), nullptr);
      moe_add_shared(routed.ccpu(), shared.ccpu(), gate.ccpu(), shared.cpu());
      CHECK_CLOSE(compare(shared, kOpTol, "moe_add_shared in place"));
    }
  }
  Mat y = Rng(105).normal(4, 3), out(2, 3);
  const std::vector<int32_t> bad = {0, 1, 4, 2};
  const std::vector<float> w = {1, 1, 1, 1};
  CHECK_THROWS_WITH_AS(moe_weighted_sum(y, bad, w, 2, out), doctest::Contains("slot 2 reads row 4"),
                       std::invalid_argument);
  CHECK_THROWS_AS(moe_weighted_sum(y, bad, w, 3, out), std::invalid_argument);  // 4 slots for 2 rows x 3
}

// ---- blocks ----------------------------------------------------------------------------------------
namespace {

struct Blas {
  cublasHandle_t h = nullptr;
  Blas() {
    REQUIRE(cublas_api().create(&h) == CUBLAS_STATUS_SUCCESS);
    REQUIRE(cublas_api().set_math_mode(h, CUBLAS_DEFAULT_MATH) == CUBLAS_STATUS_SUCCESS);
  }
  ~Blas() { cublas_api().destroy(h); }
  Blas(const Blas&) = delete;
  Blas& operator=(const Blas&) = delete;
};

const model::CausalLM& cpu_model(const std::string& dir) {
  static std::map<std::string, std::unique_ptr<model::CausalLM>> cache;
  auto& m = cache[dir];
  if (!m) m = std::make_unique<model::CausalLM>(model::CausalLM::load(dir));
  return *m;
}

// The CPU block and its GPU twin on the same random rows x hidden input, under `policy`.
void check_block(const model::Block& cpu, const GpuBlock& gpu, int hidden, int rows, int layer,
                 const std::string& policy, Rng& rng, const std::string& what) {
  CAPTURE(what); CAPTURE(rows); CAPTURE(policy);
  const ssm::PrecisionPolicy p = ssm::PrecisionPolicy::parse(policy);
  const Mat x = rng.normal(rows, hidden);
  Mat ref;
  cpu.forward(x, ref, model::LayerContext{layer, &p, 2});
  Blas blas;
  DeviceMatrixBuffer dx(rows, hidden), dout(rows, hidden);
  upload(x.data(), dx.view());
  REPLAYSSM_CUDA_CHECK(cudaDeviceSynchronize());
  gpu.forward(dx.view(), dout.view(), GpuContext{nullptr, blas.h, GemmPrecision::fp32, layer, &p});
  REPLAYSSM_CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<float> got = to_host(dout.view());
  const double scale = test::rms(ref.data(), static_cast<std::size_t>(ref.size()));
  const test::Closeness c = test::compare_close(got.data(), ref.data(), static_cast<std::size_t>(ref.size()),
                                                {kBlockTol * scale, kBlockTol}, what + " " + policy);
  MESSAGE(what << ", " << rows << " rows, " << policy << ": max |gpu - cpu| " << c.max_abs << " (rms " << scale
               << "), max |d|/allowed " << c.max_excess);
  CHECK(scale > 0);
  CHECK_CLOSE(c);
}

// The GPU's routing of random rows against the CPU's route_rows: the same experts, weights to 1e-6.
void check_routing(const model::MixtureOfExperts& cpu, const GpuMixtureOfExperts& gpu, int rows, Rng& rng,
                   const std::string& what) {
  CAPTURE(what); CAPTURE(rows);
  const Mat x = rng.normal(rows, cpu.hidden());
  const model::Routing want = cpu.route_rows(x, 2);
  Blas blas;
  DeviceMatrixBuffer dx(rows, cpu.hidden());
  upload(x.data(), dx.view());
  REPLAYSSM_CUDA_CHECK(cudaDeviceSynchronize());
  const model::Routing got = gpu.route(dx.view(), GpuContext{nullptr, blas.h, GemmPrecision::fp32, 0, nullptr});
  CHECK(got.top_k == want.top_k);
  REQUIRE(got.expert.size() == want.expert.size());
  std::size_t differ = 0, first = got.expert.size();
  for (std::size_t s = 0; s < got.expert.size(); ++s)
    if (got.expert[s] != want.expert[s] && differ++ == 0) first = s;
  INFO(what << ": " << differ << " of " << got.expert.size() << " slots pick another expert"
            << (differ ? " (first: slot " + std::to_string(first) + ", gpu " + std::to_string(got.expert[first]) +
                             ", cpu " + std::to_string(want.expert[first]) + ")"
                       : std::string()));
  CHECK(differ == 0);
  CHECK_CLOSE(test::compare_close(got.weight, want.weight, {1e-6, 1e-6}, what + " routing weights"));
}

int64_t linear_floats(const model::Linear& l) { return l.weight.size() + l.bias.size(); }

// Every MoE block of a loaded model: its layer, the CPU block, and whether it is the layer's MLP.
struct MoeBlock {
  int layer;
  const model::MixtureOfExperts* cpu;
};
std::vector<MoeBlock> moe_blocks(const model::CausalLM& lm) {
  std::vector<MoeBlock> out;
  const auto& layers = lm.layer_blocks();
  for (int li = 0; li < static_cast<int>(layers.size()); ++li) {
    if (const auto* m = dynamic_cast<const model::MixtureOfExperts*>(layers[li].mixer.get())) out.push_back({li, m});
    if (const auto* m = dynamic_cast<const model::MixtureOfExperts*>(layers[li].mlp.get())) out.push_back({li, m});
  }
  return out;
}

void check_moe_blocks(const model::CausalLM& lm, const std::string& name, uint64_t seed) {
  Rng rng(seed);
  const std::vector<MoeBlock> blocks = moe_blocks(lm);
  REQUIRE(!blocks.empty());
  for (const MoeBlock& b : blocks) {
    const std::string what = name + " layer " + std::to_string(b.layer) + " MoE";
    const GpuMixtureOfExperts gpu(*b.cpu);
    for (const int rows : {1, 5, 300}) check_block(*b.cpu, gpu, b.cpu->hidden(), rows, b.layer, "conv:fp32", rng, what);
    check_routing(*b.cpu, gpu, 300, rng, what);
    // Device bytes: the experts' formula, plus router, shared expert (and its gate) and latent projections.
    const model::MoeShape& s = b.cpu->shape();
    int64_t rest = linear_floats(b.cpu->router()) + linear_floats(b.cpu->shared_expert_gate()) +
                   linear_floats(b.cpu->latent_in()) + linear_floats(b.cpu->latent_out());
    if (const model::Mlp* sh = b.cpu->shared_expert())
      rest += linear_floats(sh->gate_proj()) + linear_floats(sh->up_proj()) + linear_floats(sh->down_proj());
    CHECK(gpu.weight_bytes() == GpuMixtureOfExperts::expert_weight_bytes(s, b.cpu->hidden()) + 4 * rest);
    const int64_t in = s.latent_size ? s.latent_size : b.cpu->hidden();
    CHECK(GpuMixtureOfExperts::expert_weight_bytes(s, b.cpu->hidden()) ==
          4 * int64_t{s.router.n_experts} * (s.activation == model::ExpertActivation::swiglu ? 3 : 2) *
              s.expert_intermediate * in);
  }
}

}  // namespace

TEST_CASE("Kimi Linear blocks (golden kimi_linear_tiny): KDA, MLA, the dense MLP and the MoE on random inputs") {
  const model::CausalLM& lm = cpu_model(test::golden_dir("kimi_linear_tiny"));
  const auto& layers = lm.layer_blocks();
  REQUIRE(layers.size() == 2);
  const int hidden = lm.config().hidden_size;
  Rng rng(110);
  const auto& kda = dynamic_cast<const model::KdaMixer&>(*layers[0].mixer);
  const GpuKdaMixer gpu_kda(kda);
  for (const std::string policy : {"conv:fp32", "shared:fp32@16", "split:fp32/fp32@8"})
    for (const int rows : {1, 3, 300}) check_block(kda, gpu_kda, hidden, rows, 0, policy, rng, "KDA");
  const auto& mla = dynamic_cast<const model::MlaAttention&>(*layers[1].mixer);
  const GpuMlaAttention gpu_mla(mla);
  for (const int rows : {1, 70, 300}) check_block(mla, gpu_mla, hidden, rows, 1, "conv:fp32", rng, "MLA");
  const auto& mlp = dynamic_cast<const model::Mlp&>(*layers[0].mlp);
  const GpuMlp gpu_mlp(mlp);
  check_block(mlp, gpu_mlp, hidden, 300, 0, "conv:fp32", rng, "dense MLP");
  check_moe_blocks(lm, "kimi_linear_tiny", 111);
}

TEST_CASE("MoE blocks of nemotron_h_moe_tiny (sigmoid, grouped, relu^2) and qwen3_5_moe_tiny (softmax, SwiGLU, gated "
          "shared expert)") {
  check_moe_blocks(cpu_model(test::golden_dir("nemotron_h_moe_tiny")), "nemotron_h_moe_tiny", 120);
  check_moe_blocks(cpu_model(test::golden_dir("qwen3_5_moe_tiny")), "qwen3_5_moe_tiny", 121);
}

TEST_CASE("blocks share one arena: KDA, MoE and MLA forwards in turn on one arena each match the CPU") {
  const model::CausalLM& lm = cpu_model(test::golden_dir("kimi_linear_tiny"));
  const auto& layers = lm.layer_blocks();
  const ScratchArena arena = std::make_shared<DeviceBuffer<float>>();
  const GpuKdaMixer kda(dynamic_cast<const model::KdaMixer&>(*layers[0].mixer), GemmPrecision::fp32, arena);
  const GpuMlaAttention mla(dynamic_cast<const model::MlaAttention&>(*layers[1].mixer), GemmPrecision::fp32, arena);
  const GpuMixtureOfExperts moe(dynamic_cast<const model::MixtureOfExperts&>(*layers[1].mlp), GemmPrecision::fp32,
                                arena);
  Rng rng(130);
  const int hidden = lm.config().hidden_size;
  for (int round = 0; round < 2; ++round) {
    check_block(*layers[0].mixer, kda, hidden, 200, 0, "conv:fp32", rng, "KDA (shared arena)");
    check_block(*layers[1].mlp, moe, hidden, 250, 1, "conv:fp32", rng, "MoE (shared arena)");
    check_block(*layers[1].mixer, mla, hidden, 300, 1, "conv:fp32", rng, "MLA (shared arena)");
  }
}

// ---- variants no golden model has ---------------------------------------------------------------
namespace {

// Random float32 tensor stored as F32.
test::RawTensor random_f32(const std::vector<int64_t>& shape, std::mt19937& rng, float scale) {
  std::normal_distribution<float> normal(0.0f, scale);
  std::size_t n = 1;
  for (const int64_t d : shape) n *= static_cast<std::size_t>(d);
  std::vector<float> v(n);
  for (float& x : v) x = normal(rng);
  test::RawTensor t;
  t.dtype = "F32";
  t.shape = shape;
  t.bytes.assign(reinterpret_cast<const char*>(v.data()), n * 4);
  return t;
}

// Row-wise log-softmax in double, as CausalLM::lm_head computes it.
Mat log_softmax(const std::vector<float>& logits, Eigen::Index rows, Eigen::Index vocab) {
  Mat out(rows, vocab);
  for (Eigen::Index r = 0; r < rows; ++r) {
    const float* row = logits.data() + r * vocab;
    float mx = -INFINITY;
    for (Eigen::Index j = 0; j < vocab; ++j) mx = std::max(mx, row[j]);
    double sum = 0.0;
    for (Eigen::Index j = 0; j < vocab; ++j) sum += std::exp(static_cast<double>(row[j]) - mx);
    const double lse = mx + std::log(sum);
    for (Eigen::Index j = 0; j < vocab; ++j) out(r, j) = static_cast<float>(static_cast<double>(row[j]) - lse);
  }
  return out;
}

// The whole model on the GPU (FP32) against the CPU on the base model's first 200 golden tokens.
void check_whole_model(const model::CausalLM& lm, const std::string& base, const std::string& what) {
  CAPTURE(what);
  REQUIRE(GpuCausalLM::unsupported_reason(lm).empty());
  std::vector<int64_t> tokens = test::read_tokens(test::golden_dir(base) + "/tokens.npy");
  REQUIRE(tokens.size() >= 200);
  tokens.resize(200);
  model::ForwardOptions o;
  o.threads = 2;
  const Mat ref = lm.log_probs(tokens, ssm::PrecisionPolicy::parse("conv:fp32"), o);
  const GpuCausalLM g(lm, GemmPrecision::fp32);
  const std::vector<int32_t> ids(tokens.begin(), tokens.end());
  const int64_t n = static_cast<int64_t>(ids.size());
  DeviceMatrixBuffer hidden(n, g.hidden_size()), logits(n, g.vocab_size());
  g.final_hidden(ids, ssm::PrecisionPolicy::parse("conv:fp32"), hidden.view());
  g.lm_logits(hidden.view(), logits.view());
  REPLAYSSM_CUDA_CHECK(cudaStreamSynchronize(g.stream()));
  const Mat got = log_softmax(to_host(logits.view()), n, g.vocab_size());
  const test::Closeness c = test::compare_close(got.data(), ref.data(), static_cast<std::size_t>(ref.size()),
                                                {1e-5, 1e-5}, what + " log-probs");
  MESSAGE(what << ": log-probs max |gpu - cpu| " << c.max_abs);
  CHECK_CLOSE(c);
}

}  // namespace

TEST_CASE("MLA with a low-rank query (q_a -> RMSNorm -> q_b) and biases: block and whole model") {
  test::TempDir tmp;
  const fs::path dir = tmp.path() / "kimi_q_lora";
  test::copy_model("kimi_linear_tiny", dir);
  const int q_rank = 12;
  test::edit_config(dir, [&](nlohmann::json& j) {
    j["q_lora_rank"] = q_rank;
    j["attention_bias"] = true;
  });
  test::RawTensors raw = test::read_safetensors_raw(dir / "model.safetensors");
  const std::string p = "model.layers.1.self_attn.";
  REQUIRE(raw.count(p + "q_proj.weight"));
  const int64_t q_width = raw[p + "q_proj.weight"].shape[0], hidden = raw[p + "q_proj.weight"].shape[1];
  raw.erase(p + "q_proj.weight");
  std::mt19937 gen(140);
  raw[p + "q_a_proj.weight"] = random_f32({q_rank, hidden}, gen, 0.2f);
  raw[p + "q_a_proj.bias"] = random_f32({q_rank}, gen, 0.1f);
  raw[p + "q_a_layernorm.weight"] = random_f32({q_rank}, gen, 1.0f);
  raw[p + "q_b_proj.weight"] = random_f32({q_width, q_rank}, gen, 0.3f);
  raw[p + "kv_a_proj_with_mqa.bias"] = random_f32({raw[p + "kv_a_proj_with_mqa.weight"].shape[0]}, gen, 0.1f);
  raw[p + "o_proj.bias"] = random_f32({hidden}, gen, 0.1f);
  test::write_safetensors_raw(dir / "model.safetensors", raw);
  const model::CausalLM& lm = cpu_model(dir.string());
  REQUIRE(lm.config().mla.q_lora_rank == q_rank);
  REQUIRE(lm.config().mla.bias);
  const auto& mla = dynamic_cast<const model::MlaAttention&>(*lm.layer_blocks()[1].mixer);
  const GpuMlaAttention gpu(mla);
  Rng rng(141);
  for (const int rows : {1, 300}) check_block(mla, gpu, lm.config().hidden_size, rows, 1, "conv:fp32", rng, "MLA q_lora");
  check_whole_model(lm, "kimi_linear_tiny", "kimi_linear_tiny with q_lora_rank and attention_bias");
}

TEST_CASE("MoE with a latent projection (Nemotron-H moe_latent_size): block and whole model") {
  test::TempDir tmp;
  const fs::path dir = tmp.path() / "nemotron_latent";
  test::copy_model("nemotron_h_moe_tiny", dir);
  const int latent = 12;
  test::edit_config(dir, [&](nlohmann::json& j) { j["moe_latent_size"] = latent; });
  test::RawTensors raw = test::read_safetensors_raw(dir / "model.safetensors");
  std::mt19937 gen(150);
  int rewritten = 0;
  for (auto& [name, t] : raw) {
    if (name.find(".experts.") == std::string::npos) continue;
    if (name.find(".up_proj.weight") != std::string::npos)
      t = random_f32({t.shape[0], latent}, gen, 0.3f);
    else
      t = random_f32({latent, t.shape[1]}, gen, 0.3f);
    ++rewritten;
  }
  REQUIRE(rewritten == 2 * 2 * 8);  // two MoE layers, eight experts, up and down
  for (const int layer : {1, 4}) {
    const std::string p = "backbone.layers." + std::to_string(layer) + ".mixer.";
    raw[p + "fc1_latent_proj.weight"] = random_f32({latent, 32}, gen, 0.2f);
    raw[p + "fc2_latent_proj.weight"] = random_f32({32, latent}, gen, 0.3f);
  }
  test::write_safetensors_raw(dir / "model.safetensors", raw);
  const model::CausalLM& lm = cpu_model(dir.string());
  REQUIRE(lm.config().moe.latent_size == latent);
  check_moe_blocks(lm, "nemotron_h_moe_tiny with moe_latent_size", 151);
  check_whole_model(lm, "nemotron_h_moe_tiny", "nemotron_h_moe_tiny with moe_latent_size");
}

TEST_CASE("MoE experts in transformers' fused layout (row slices of one tensor) upload the same values") {
  test::TempDir tmp;
  const fs::path dir = tmp.path() / "qwen_fused";
  test::copy_model("qwen3_5_moe_tiny", dir);
  test::RawTensors raw = test::read_safetensors_raw(dir / "model.safetensors"), fused;
  // experts.{e}.{gate,up}_proj -> experts.gate_up_proj [E, 2I, H] (gate rows first), down -> [E, H, I].
  std::map<std::string, std::vector<std::string>> parts;
  for (auto& [n, t] : raw) {
    const auto at = n.find(".experts.");
    if (at == std::string::npos) {
      fused[n] = t;
      continue;
    }
    const std::string layer = n.substr(0, at), rest = n.substr(at + 9);
    const int e = std::stoi(rest.substr(0, rest.find('.')));
    const std::string proj = rest.substr(rest.find('.') + 1, rest.rfind('.') - rest.find('.') - 1);
    const bool down = proj == "down_proj";
    const std::string target = layer + ".experts." + (down ? "down_proj" : "gate_up_proj");
    auto& v = parts[target];
    v.resize(16);
    v[static_cast<std::size_t>(2 * e + (proj == "up_proj" ? 1 : 0))] = t.bytes;
    auto& f = fused[target];
    f.dtype = t.dtype;
    f.shape = {8, t.shape[0] * (down ? 1 : 2), t.shape[1]};
  }
  for (auto& [target, v] : parts) {
    std::string bytes;
    for (const auto& b : v) bytes += b;
    fused[target].bytes = bytes;
  }
  test::write_safetensors_raw(dir / "model.safetensors", fused);
  const model::CausalLM& lm = cpu_model(dir.string());
  check_moe_blocks(lm, "qwen3_5_moe_tiny (fused experts)", 160);
  // The same uploaded values as the per-expert layout: the GPU blocks agree to the bit.
  const model::CausalLM& base = cpu_model(test::golden_dir("qwen3_5_moe_tiny"));
  const GpuMixtureOfExperts a(*moe_blocks(lm)[0].cpu), b(*moe_blocks(base)[0].cpu);
  Rng rng(161);
  const Mat x = rng.normal(64, lm.config().hidden_size);
  Blas blas;
  const ssm::PrecisionPolicy p = ssm::PrecisionPolicy::parse("conv:fp32");
  DeviceMatrixBuffer dx(64, x.cols()), ya(64, x.cols()), yb(64, x.cols());
  upload(x.data(), dx.view());
  REPLAYSSM_CUDA_CHECK(cudaDeviceSynchronize());
  a.forward(dx.view(), ya.view(), GpuContext{nullptr, blas.h, GemmPrecision::fp32, 0, &p});
  b.forward(dx.view(), yb.view(), GpuContext{nullptr, blas.h, GemmPrecision::fp32, 0, &p});
  REPLAYSSM_CUDA_CHECK(cudaDeviceSynchronize());
  CHECK_CLOSE(test::compare_close(to_host(ya.view()), to_host(yb.view()), {0, 0}, "fused vs per-expert layout"));
}
