// The GPU forward's ops (cuda/model/model_ops.h) and GpuLinear (linear_gpu.h) against their CPU
// twins on fresh random inputs (fixed seeds, never all zeros), awkward shapes: 1 row, fewer rows than
// the conv kernel, widths that are not multiples of 32, strided column blocks of wider matrices
// (and the columns around them must come back untouched). Tolerances (test_util.h compare_close):
// element-wise and row-wise ops |gpu - cpu| <= 1e-6 (rms + |cpu|) (the GPU's expf/log1pf are within
// 2 ulp of glibc's; sums of squares are in double on both sides); FP32 GEMM 1e-5 (rms + |cpu|) (the
// summation order differs). BF16 products (bf16, bf16x3) and SGEMM are measured against a float64
// product, printed, and bounded per element by linear_gpu.h's a-priori bounds; bf16x3 also within a
// small multiple of SGEMM's own error. Skips (77) without a GPU.
#include <doctest/doctest.h>

#include <boost/random/mersenne_twister.hpp>
#include <boost/random/normal_distribution.hpp>
#include <boost/random/uniform_int_distribution.hpp>
#include <boost/random/uniform_real_distribution.hpp>
#include <cmath>
#include <cstring>
#include <limits>
#include <tuple>
#include <utility>
#include <vector>

#include "cuda_check.h"
#include "model/bf16_split.h"
#include "model/causal_lm.h"
#include "model/gpu_causal_lm.h"
#include "model/gpu_timing.h"
#include "model/linear_gpu.h"
#include "model/model_ops.h"
#include "test_util.h"
#include "model/cublas_api.h"
#include "gpu_test_util.h"

using namespace replayssm;
using namespace replayssm::cuda;
using model::Mat;
using model::Vec;

namespace {

const test::GpuGuard gpu_guard("model op tests");

struct Rng {
  boost::random::mt19937_64 gen;
  explicit Rng(uint64_t salt) : gen(test::kBaseSeed + salt) {}
  Mat normal(Eigen::Index rows, Eigen::Index cols, float scale = 1.0f) {
    boost::random::normal_distribution<float> d(0.0f, scale);
    Mat m(rows, cols);
    for (Eigen::Index i = 0; i < m.size(); ++i) m.data()[i] = d(gen);
    return m;
  }
  Mat uniform(Eigen::Index rows, Eigen::Index cols, float lo, float hi) {
    boost::random::uniform_real_distribution<float> d(lo, hi);
    Mat m(rows, cols);
    for (Eigen::Index i = 0; i < m.size(); ++i) m.data()[i] = d(gen);
    return m;
  }
  Vec vec(Eigen::Index n, float lo, float hi) {
    const Mat m = uniform(n, 1, lo, hi);
    return Eigen::Map<const Vec>(m.data(), n);
  }
};

DeviceBuffer<float> dev(const Vec& v) {
  DeviceBuffer<float> b;
  b.upload(v.data(), static_cast<std::size_t>(v.size()));
  return b;
}
DeviceBuffer<float> dev(const Mat& m) {
  DeviceBuffer<float> b;
  b.upload(m.data(), static_cast<std::size_t>(m.size()));
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

// got vs the CPU twin's result, |d| <= rtol (rms(ref) + |ref|).
test::Closeness compare(const Wide& w, double rtol, const std::string& what) {
  const std::vector<float> got = w.back(), ref = w.ref();
  const double scale = test::rms(ref.data(), ref.size());
  return test::compare_close(got, ref, {rtol * scale, rtol}, what);
}

constexpr double kOpTol = 1e-6, kGemmTol = 1e-5;

}  // namespace

TEST_CASE("embedding_gather_gpu equals its twin (exact copies), the twin refuses ids outside the table") {
  Rng rng(1);
  const Mat table = rng.normal(50, 45);
  DeviceMatrixBuffer t(50, 45);
  upload(table.data(), t.view());
  for (const int n : {1, 300}) {
    std::vector<int32_t> tokens(static_cast<std::size_t>(n));
    boost::random::uniform_int_distribution<int32_t> id(0, 49);
    for (auto& v : tokens) v = id(rng.gen);
    tokens[0] = n > 1 ? 49 : 0;
    DeviceBuffer<int32_t> ids;
    ids.upload(tokens);
    Wide out(rng, n, 45, 3, 5);
    embedding_gather_gpu(t.view(), ids.data(), out.gpu(), nullptr);
    embedding_gather(table, tokens, out.cpu());
    const std::vector<float> got = out.back(), ref = out.ref();
    CHECK(got == ref);
  }
  std::vector<int32_t> bad = {1, 50};
  Mat out(2, 45);
  CHECK_THROWS_WITH_AS(embedding_gather(table, bad, out), doctest::Contains("token 50 at position 1"),
                       std::invalid_argument);
}

TEST_CASE("RMSNorms: plain, (1 + w), grouped, Mamba-2 gated, GDN per-head gated") {
  Rng rng(2);
  for (const int rows : {1, 257}) {
    for (const int group : {129, 43}) {
      for (const bool plus_one : {false, true}) {
        CAPTURE(rows); CAPTURE(group); CAPTURE(plus_one);
        Wide x(rng, rows, 129, 7, 2, 3.0f);
        Wide out(rng, rows, 129, 1, 4);
        const Vec w = rng.vec(129, -1.5f, 1.5f);
        const auto dw = dev(w);
        rms_norm_rows_gpu(x.gpu(), out.gpu(), dw, 1e-5f, plus_one, group, nullptr);
        rms_norm_rows(x.ccpu(), out.cpu(), w, 1e-5f, plus_one, group);
        CHECK_CLOSE(compare(out, kOpTol, "rms_norm_rows"));
        // In place.
        rms_norm_rows_gpu(x.gpu(), x.gpu(), dw, 1e-6f, plus_one, group, nullptr);
        rms_norm_rows(x.ccpu(), x.cpu(), w, 1e-6f, plus_one, group);
        CHECK_CLOSE(compare(x, kOpTol, "rms_norm_rows in place"));
      }
      Wide y(rng, rows, 129, 0, 3, 2.0f), z(rng, rows, 129, 11, 0, 2.0f);
      const Vec w = rng.vec(129, 0.5f, 1.5f);
      gated_rms_norm_gpu(y.gpu(), z.gpu(), dev(w), 1e-5f, group, y.gpu(), nullptr);
      gated_rms_norm(y.ccpu(), z.ccpu(), w, 1e-5f, group, y.cpu());
      CHECK_CLOSE(compare(y, kOpTol, "gated_rms_norm (Mamba-2)"));
    }
    for (const int dv : {24, 80, 128}) {
      CAPTURE(dv);
      Wide o(rng, rows, 3 * dv, 5, 0, 0.3f), z(rng, rows, 3 * dv, 0, 9, 2.0f);
      const Vec w = rng.vec(dv, 0.5f, 1.5f);
      head_norm_gate_gpu(o.gpu(), z.gpu(), dev(w), 1e-6f, o.gpu(), nullptr);
      head_norm_gate(o.ccpu(), z.ccpu(), w, 1e-6f, o.cpu());
      CHECK_CLOSE(compare(o, kOpTol, "head_norm_gate (GDN)"));
    }
  }
  Wide x(rng, 4, 129);
  CHECK_THROWS_AS(rms_norm_rows_gpu(x.gpu(), x.gpu(), dev(Vec(Vec::Ones(128))), 1e-5f, false, 129, nullptr),
                  std::invalid_argument);
  CHECK_THROWS_AS(rms_norm_rows_gpu(x.gpu(), x.gpu(), dev(Vec(Vec::Ones(129))), 1e-5f, false, 40, nullptr),
                  std::invalid_argument);
}

TEST_CASE("causal_conv1d_silu_gpu equals model::causal_conv1d_silu: bias or none, strided blocks, N < K") {
  Rng rng(3);
  for (const int rows : {1, 3, 300}) {
    for (const int k : {4, 2}) {
      for (const bool bias : {true, false}) {
        CAPTURE(rows); CAPTURE(k); CAPTURE(bias);
        Wide x(rng, rows, 70, 13, 17);  // xBC inside in_proj's output
        Wide out(rng, rows, 70, 0, 2);
        const Mat w = rng.normal(70, k, 0.5f);
        const Vec b = bias ? rng.vec(70, -0.5f, 0.5f) : Vec();
        causal_conv1d_silu_gpu(x.gpu(), dev(w), k, dev(b), out.gpu(), nullptr);
        causal_conv1d_silu(x.ccpu(), w, b, out.cpu());
        CHECK_CLOSE(compare(out, kOpTol, "causal_conv1d_silu"));
      }
    }
  }
  Wide x(rng, 8, 70);
  CHECK_THROWS_AS(causal_conv1d_silu_gpu(x.gpu(), dev(rng.normal(70, 4)), 4, DeviceBuffer<float>(), x.gpu(), nullptr),
                  std::invalid_argument);  // in place is refused
}

TEST_CASE("Mamba-2 inputs (dt clamp, alpha, v = dt x) and the D skip") {
  Rng rng(4);
  const int heads = 6, dv = 10;
  for (const int rows : {1, 301}) {
    for (const double dt_max : {2.0, std::numeric_limits<double>::infinity()}) {
      CAPTURE(rows); CAPTURE(dt_max);
      Wide raw(rng, rows, heads, 2, 1, 8.0f);  // past softplus' threshold 20 sometimes, and the clamps
      raw.host(0, 2) = 25.0f;
      raw.sync();
      Wide x(rng, rows, heads * dv, 3, 0);
      Wide alpha(rng, rows, heads, 0, 3), v(rng, rows, heads * dv, 1, 1);
      const Vec dt_bias = rng.vec(heads, -2.0f, 1.0f), a_log = rng.vec(heads, -1.0f, 2.0f);
      mamba2_inputs_gpu(raw.gpu(), x.gpu(), dev(dt_bias), dev(a_log), 0.05, dt_max, alpha.gpu(), v.gpu(), nullptr);
      mamba2_inputs(raw.ccpu(), x.ccpu(), dt_bias, a_log, 0.05, dt_max, alpha.cpu(), v.cpu());
      CHECK_CLOSE(compare(alpha, kOpTol, "mamba2 alpha"));
      CHECK_CLOSE(compare(v, kOpTol, "mamba2 v"));

      Wide o(rng, rows, heads * dv, 0, 4);
      const Vec d = rng.vec(heads, -1.0f, 1.0f);
      mamba2_skip_gpu(o.gpu(), x.gpu(), dev(d), o.gpu(), nullptr);
      mamba2_skip(o.ccpu(), x.ccpu(), d, o.cpu());
      CHECK_CLOSE(compare(o, kOpTol, "mamba2 skip"));
    }
  }
}

TEST_CASE("Gated DeltaNet: q/k L2 normalisation (q scaled) and the beta/alpha gates") {
  Rng rng(5);
  for (const int rows : {1, 129}) {
    for (const int dk : {24, 64, 128, 256}) {
      CAPTURE(rows); CAPTURE(dk);
      Wide qk(rng, rows, 3 * dk, 0, 2 * dk);  // q inside [q | k | v]
      const float scale = static_cast<float>(std::pow(static_cast<double>(dk), -0.5));
      l2_normalise_heads_gpu(qk.gpu(), dk, scale, qk.gpu(), nullptr);
      l2_normalise_heads(qk.ccpu(), dk, scale, qk.cpu());
      CHECK_CLOSE(compare(qk, kOpTol, "l2_normalise_heads q"));
      Wide k(rng, rows, 2 * dk, dk, 0);
      l2_normalise_heads_gpu(k.gpu(), dk, 1.0f, k.gpu(), nullptr);
      l2_normalise_heads(k.ccpu(), dk, 1.0f, k.cpu());
      CHECK_CLOSE(compare(k, kOpTol, "l2_normalise_heads k"));
    }
    const int nv = 5;
    Wide ba(rng, rows, 2 * nv, 7, 0, 4.0f);  // [b | a] at the end of the fused projection
    ba.host(0, 7 + nv) = 30.0f;              // softplus' linear branch
    ba.sync();
    const Vec dt_bias = rng.vec(nv, -1.0f, 1.0f), a_log = rng.vec(nv, -1.0f, 1.5f);
    DeviceMatrix b = ba.device.view().columns(7, nv), a = ba.device.view().columns(7 + nv, nv);
    gdn_gates_gpu(b, a, dev(dt_bias), dev(a_log), b, a, nullptr);
    MatRef hb = ba.host.middleCols(7, nv), ha = ba.host.middleCols(7 + nv, nv);
    gdn_gates(hb, ha, dt_bias, a_log, hb, ha);
    CHECK_CLOSE(compare(ba, kOpTol, "gdn_gates (in place)"));
  }
}

TEST_CASE("MLP activations, residual add and bias") {
  Rng rng(6);
  for (const int rows : {1, 77}) {
    CAPTURE(rows);
    Wide gu(rng, rows, 2 * 45, 0, 0, 3.0f);  // [gate | up]
    DeviceMatrix g = gu.device.view().columns(0, 45), u = gu.device.view().columns(45, 45);
    swiglu_gpu(g, u, u, nullptr);
    MatRef hu = gu.host.middleCols(45, 45);
    swiglu(gu.host.middleCols(0, 45), hu, hu);
    CHECK_CLOSE(compare(gu, kOpTol, "swiglu"));

    Wide x(rng, rows, 45, 2, 2, 3.0f);
    relu2_gpu(x.gpu(), x.gpu(), nullptr);
    relu2(x.ccpu(), x.cpu());
    CHECK_CLOSE(compare(x, kOpTol, "relu2"));

    Wide h(rng, rows, 45, 0, 3), d(rng, rows, 45, 4, 0);
    residual_add_gpu(h.gpu(), d.gpu(), nullptr);
    residual_add(h.cpu(), d.ccpu());
    CHECK_CLOSE(compare(h, kOpTol, "residual_add"));

    const Vec b = rng.vec(45, -1.0f, 1.0f);
    add_bias_gpu(h.gpu(), dev(b), nullptr);
    add_bias(h.cpu(), b);
    CHECK_CLOSE(compare(h, kOpTol, "add_bias"));
  }
}

TEST_CASE("split_bf16_gpu equals its twin bit for bit; x = hi + lo + r with |r| <= 2^-16 |x|") {
  Rng rng(7);
  Wide x(rng, 33, 45, 3, 0, 10.0f);
  const std::size_t n = 33 * 45;
  DeviceBuffer<__nv_bfloat16> hi(n), lo(n);
  split_bf16_gpu(x.gpu(), hi.data(), lo.data(), nullptr);
  std::vector<__nv_bfloat16> chi(n), clo(n);
  split_bf16(x.ccpu(), chi.data(), clo.data());
  const std::vector<__nv_bfloat16> ghi = hi.to_host(), glo = lo.to_host();
  CHECK(std::memcmp(ghi.data(), chi.data(), n * 2) == 0);
  CHECK(std::memcmp(glo.data(), clo.data(), n * 2) == 0);
  double worst = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const float v = x.host(static_cast<Eigen::Index>(i / 45), 3 + static_cast<Eigen::Index>(i % 45));
    const double r = std::abs(double(v) - __bfloat162float(chi[i]) - __bfloat162float(clo[i]));
    worst = std::max(worst, r / std::abs(double(v)));
  }
  MESSAGE("split_bf16: max |x - hi - lo| / |x| = " << worst << " (bound 2^-16 = " << std::ldexp(1.0, -16) << ")");
  CHECK(worst <= std::ldexp(1.0, -16));
}

namespace {
struct Cublas {
  cublasHandle_t h = nullptr;
  Cublas() {
    REQUIRE(cublas_api().create(&h) == CUBLAS_STATUS_SUCCESS);
    REQUIRE(cublas_api().set_math_mode(h, CUBLAS_DEFAULT_MATH) == CUBLAS_STATUS_SUCCESS);
  }
  ~Cublas() { cublas_api().destroy(h); }
};

// Per-element a = sum_k |x_k| |W_k| (double): the scale of the GEMM error bounds.
Mat abs_products(const Mat& x, const Mat& w) {
  const Eigen::MatrixXd a = x.cast<double>().cwiseAbs() * w.cast<double>().cwiseAbs().transpose();
  return a.cast<float>();
}
}  // namespace

TEST_CASE("GpuLinear fp32 (SGEMM) equals model::Linear::apply; strided x and y; shape and math-mode errors") {
  Rng rng(8);
  Cublas blas;
  const GpuContext ctx{nullptr, blas.h, GemmPrecision::fp32, 0, nullptr};
  for (const int rows : {1, 37, 300}) {
    for (const int in : {45, 130}) {
      for (const int out : {1, 33, 300}) {
        for (const bool bias : {false, true}) {
          CAPTURE(rows); CAPTURE(in); CAPTURE(out); CAPTURE(bias);
          model::Linear cpu;
          cpu.weight = rng.normal(out, in, 1.0f / std::sqrt(float(in)));
          if (bias) cpu.bias = rng.vec(out, -1.0f, 1.0f);
          const GpuLinear gpu(cpu);
          CHECK(gpu.weight_bytes() == 4 * int64_t{out} * (in + (bias ? 1 : 0)));
          Wide x(rng, rows, in, 5, 3), y(rng, rows, out, 2, 7);
          gpu.apply(x.gpu(), y.gpu(), ctx);
          Mat ref;
          cpu.apply(x.host.middleCols(5, in), ref, 1);
          y.cpu() = ref;
          CHECK_CLOSE(compare(y, kGemmTol, "GpuLinear fp32"));
        }
      }
    }
  }
  model::Linear cpu;
  cpu.weight = rng.normal(8, 16);
  const GpuLinear gpu(cpu);
  Wide x(rng, 4, 16), y(rng, 4, 8), bad(rng, 4, 9);
  CHECK_THROWS_AS(gpu.apply(x.gpu(), bad.gpu(), ctx), std::invalid_argument);
  REQUIRE(cublas_api().set_math_mode(blas.h, CUBLAS_TF32_TENSOR_OP_MATH) == CUBLAS_STATUS_SUCCESS);
  CHECK_THROWS_WITH_AS(gpu.apply(x.gpu(), y.gpu(), ctx), doctest::Contains("math mode"), std::logic_error);
}

namespace {
// y64 = x W^T + b in float64 (the reference both SGEMM and the BF16 products are measured against).
Eigen::MatrixXd product64(const Mat& x, const model::Linear& lin) {
  Eigen::MatrixXd y = x.cast<double>() * lin.weight.cast<double>().transpose();
  if (lin.bias.size()) y.rowwise() += lin.bias.cast<double>().transpose();
  return y;
}
struct ErrorStats {
  double max = 0, rms = 0;  // of |y - y64| / (a + |b|)
  std::size_t over = 0;     // elements above the a-priori bound
  std::size_t first_over = SIZE_MAX;
  double first_got = 0, first_ref = 0, first_allowed = 0;
};
// got: rows x out inside a matrix of ld columns; bound(a) the allowed error for scale a.
template <class Bound>
ErrorStats errors(const std::vector<float>& got, Eigen::Index ld, const Eigen::MatrixXd& ref, const Mat& a,
                  const model::Vec& bias, Bound bound) {
  ErrorStats e;
  double sum2 = 0;
  for (Eigen::Index r = 0; r < ref.rows(); ++r)
    for (Eigen::Index c = 0; c < ref.cols(); ++c) {
      const double scale = double(a(r, c)) + (bias.size() ? std::abs(double(bias(c))) : 0.0);
      const double g = got[static_cast<std::size_t>(r * ld + c)], d = std::abs(g - ref(r, c)), rel = d / scale;
      e.max = std::max(e.max, rel);
      sum2 += rel * rel;
      if (d > bound(scale)) {
        if (e.over++ == 0) {
          e.first_over = static_cast<std::size_t>(r * ref.cols() + c);
          e.first_got = g, e.first_ref = ref(r, c), e.first_allowed = bound(scale);
        }
      }
    }
  e.rms = std::sqrt(sum2 / static_cast<double>(ref.size()));
  return e;
}
}  // namespace

TEST_CASE("split_bf16x3_gpu equals its twin bit for bit; x = p1 + p2 + p3 exactly for 2^-110 <= |x| < 2^127") {
  Rng rng(10);
  for (const auto& [rows, cols] : {std::pair{1, 1}, std::pair{33, 45}, std::pair{257, 130}}) {
    CAPTURE(rows); CAPTURE(cols);
    // Values over the whole range where the split is exact (random 24-bit significands, exponents
    // -110 .. 126, both signs), a few below it (FP32 subnormals included) and zeros; in a strided block.
    Wide x(rng, rows, cols, 2, 5);
    boost::random::uniform_int_distribution<int> exponent(-110, 126), coin(0, 1);
    boost::random::uniform_real_distribution<float> significand(1.0f, 2.0f);
    for (Eigen::Index r = 0; r < rows; ++r)
      for (Eigen::Index c = 0; c < cols; ++c)
        x.host(r, 2 + c) = (coin(rng.gen) ? -1.0f : 1.0f) * std::ldexp(significand(rng.gen), exponent(rng.gen));
    if (rows * cols > 8) {
      x.host(0, 2) = 0.0f;
      x.host(0, 3) = -std::ldexp(1.2345678f, -120);
      x.host(0, 4) = std::ldexp(1.0f, -140);  // FP32 subnormal
      x.host(0, 5) = 3.0e38f;                 // below BF16's overflow threshold 0x1.ffp127
    }
    x.sync();
    const std::size_t n = static_cast<std::size_t>(rows) * cols;
    DeviceBuffer<__nv_bfloat16> p1(n), p2(n), p3(n);
    DeviceBuffer<int> flag(1);
    REPLAYSSM_CUDA_CHECK(cudaMemset(flag.data(), 0, sizeof(int)));
    split_bf16x3_gpu(x.gpu(), p1.data(), p2.data(), p3.data(), flag.data(), nullptr);
    std::vector<__nv_bfloat16> c1(n), c2(n), c3(n);
    int cflag = 0;
    split_bf16x3(x.ccpu(), c1.data(), c2.data(), c3.data(), &cflag);
    const std::vector<__nv_bfloat16> g1 = p1.to_host(), g2 = p2.to_host(), g3 = p3.to_host();
    const std::vector<int> gflag = flag.to_host();
    for (const auto& [g, c, name] : {std::tuple{&g1, &c1, "p1"}, std::tuple{&g2, &c2, "p2"}, std::tuple{&g3, &c3, "p3"}}) {
      std::size_t first = n;
      for (std::size_t i = 0; i < n && first == n; ++i)
        if (std::memcmp(&(*g)[i], &(*c)[i], 2) != 0) first = i;
      INFO(name << ": first GPU/CPU mismatch at " << first << " of " << n);
      CHECK(first == n);
    }
    CHECK(gflag[0] == 1);
    CHECK(cflag == 1);
    std::size_t inexact = 0;
    double worst_tiny = 0;
    for (std::size_t i = 0; i < n; ++i) {
      const double v = x.host(static_cast<Eigen::Index>(i / cols), 2 + static_cast<Eigen::Index>(i % cols));
      const double sum = double(__bfloat162float(c1[i])) + __bfloat162float(c2[i]) + __bfloat162float(c3[i]);
      if (std::abs(v) >= std::ldexp(1.0, -110) || v == 0.0) {
        if (sum != v && inexact++ == 0) MESSAGE("first inexact split at " << i << ": x = " << v << ", sum = " << sum);
      } else {
        worst_tiny = std::max(worst_tiny, std::abs(v - sum));
      }
    }
    CHECK(inexact == 0);
    CHECK(worst_tiny <= std::ldexp(1.0, -134));
  }
  // BF16 values: p2 = p3 = 0 and the flag stays 0 (a BF16 checkpoint's weights).
  Wide w(rng, 17, 40);
  for (Eigen::Index i = 0; i < w.host.size(); ++i)
    w.host.data()[i] = __bfloat162float(__float2bfloat16_rn(w.host.data()[i]));
  w.sync();
  DeviceBuffer<__nv_bfloat16> q1(680), q2(680), q3(680);
  DeviceBuffer<int> flag(1);
  REPLAYSSM_CUDA_CHECK(cudaMemset(flag.data(), 0, sizeof(int)));
  split_bf16x3_gpu(w.gpu(), q1.data(), q2.data(), q3.data(), flag.data(), nullptr);
  CHECK(flag.to_host()[0] == 0);
  std::size_t nonzero = 0;
  for (const auto& v : q2.to_host()) nonzero += __bfloat162float(v) != 0.0f;
  for (const auto& v : q3.to_host()) nonzero += __bfloat162float(v) != 0.0f;
  CHECK(nonzero == 0);
}

TEST_CASE("GpuLinear bf16x3 is FP32-accurate: its error against float64 is within SGEMM's (small multiple) and "
          "the a-priori bound; bf16 within its own") {
  Rng rng(9);
  Cublas blas;
  const double u = std::ldexp(1.0, -8), u32 = std::ldexp(1.0, -23);
  for (const bool bf16_weights : {false, true}) {
    for (const int in : {1, 3, 130, 1100}) {
      for (const int rows : {1, 37, 5000}) {  // 5000 > kSplitRows: x is split in two blocks
        if (in == 1100 && rows == 37) continue;
        CAPTURE(bf16_weights); CAPTURE(in); CAPTURE(rows);
        const int out = 70;
        model::Linear cpu;
        cpu.weight = rng.normal(out, in, 1.0f / std::sqrt(float(in)));
        if (bf16_weights)  // a BF16 checkpoint: every weight a BF16 value
          for (Eigen::Index i = 0; i < cpu.weight.size(); ++i)
            cpu.weight.data()[i] = __bfloat162float(__float2bfloat16_rn(cpu.weight.data()[i]));
        cpu.bias = rng.vec(out, -1.0f, 1.0f);
        Wide x(rng, rows, in, 0, 6, 2.0f);
        const Mat xs = x.host.middleCols(0, in);
        const Eigen::MatrixXd ref = product64(xs, cpu);
        const Mat a = abs_products(xs, cpu.weight);
        const GpuLinear sgemm(cpu), gpu(cpu, GemmPrecision::bf16x3);
        CHECK(gpu.weight_is_bf16() == bf16_weights);
        // The float32 weight and bias, and 1 (BF16 weights) or 3 BF16 parts.
        CHECK(gpu.weight_bytes() == 4 * int64_t{out} * (in + 1) + 2 * int64_t{out} * in * (bf16_weights ? 1 : 3));
        auto run = [&](const GpuLinear& lin, GemmPrecision p) {
          Wide y(rng, rows, out, 0, 1);
          lin.apply(x.gpu(), y.gpu(), GpuContext{nullptr, blas.h, p, 0, nullptr});
          return y.back();
        };
        // A-priori (linear_gpu.h): FP32 accumulation in any order with at most one FP32 ulp per
        // addition ((k - 1) 2^-23 a, RZ or RN alike), up to 5 beta = 1 additions and the bias add,
        // and for non-BF16 weights the dropped (2 u^3 + u^4) a.
        const double dropped = bf16_weights ? 0.0 : 2 * u * u * u + u * u * u * u;
        const ErrorStats e32 = errors(run(sgemm, GemmPrecision::fp32), out + 1, ref, a, cpu.bias,
                                      [&](double s) { return (in + 2) * std::ldexp(1.0, -24) * s; });
        const ErrorStats e3 = errors(run(gpu, GemmPrecision::bf16x3), out + 1, ref, a, cpu.bias,
                                     [&](double s) { return ((in + 8) * u32 + dropped) * s; });
        const ErrorStats e1 = errors(run(gpu, GemmPrecision::bf16), out + 1, ref, a, cpu.bias,
                                     [&](double s) { return (2 * u + u * u + (in + 2) * u32) * s; });
        MESSAGE((bf16_weights ? "BF16" : "FP32") << " weights, k = " << in << ", " << rows
                                                 << " rows: |y - y64| / (sum|x||W| + |b|) max / rms: SGEMM " << e32.max
                                                 << " / " << e32.rms << ", bf16x3 " << e3.max << " / " << e3.rms
                                                 << " (rms ratio " << e3.rms / e32.rms << "), bf16 " << e1.max << " / "
                                                 << e1.rms);
        for (const auto& [e, name] : {std::pair{&e32, "SGEMM"}, std::pair{&e3, "bf16x3"}, std::pair{&e1, "bf16"}}) {
          INFO(name << ": " << e->over << " elements above the a-priori bound; first at " << e->first_over << ": got "
                    << e->first_got << ", float64 " << e->first_ref << ", allowed |d| " << e->first_allowed);
          CHECK(e->over == 0);
        }
        // FP32-accurate: within a small multiple of SGEMM's own error (the tensor cores accumulate in
        // another order and rounding; measured ratios are printed above).
        CHECK(e3.rms <= 8 * e32.rms + 1e-12);
        CHECK(e3.max <= 8 * e32.max + 1e-12);
        CHECK(e3.max < e1.max / 64);  // 24 bits against bf16's 8 (at least 6 bits better even with k = 1100)
      }
    }
  }
}

TEST_CASE("GemmTally: every apply is counted, timed and its FLOPs added; GpuIntervals refuses misuse") {
  Rng rng(11);
  Cublas blas;
  model::Linear cpu;
  cpu.weight = rng.normal(64, 96);
  const GpuLinear lin(cpu, GemmPrecision::bf16x3);
  Wide x(rng, 300, 96), y(rng, 300, 64);
  GpuIntervals intervals(3);
  GemmTally tally;
  tally.intervals = &intervals;
  tally.category = 2;
  {
    const ScopedGemmTally scope(&tally);
    lin.apply(x.gpu(), y.gpu(), GpuContext{nullptr, blas.h, GemmPrecision::fp32, 0, nullptr});
    lin.apply(x.gpu(), y.gpu(), GpuContext{nullptr, blas.h, GemmPrecision::bf16x3, 0, nullptr});
  }
  lin.apply(x.gpu(), y.gpu(), GpuContext{nullptr, blas.h, GemmPrecision::fp32, 0, nullptr});  // not counted
  const double flops = 2.0 * 300 * 96 * 64;
  CHECK(tally.calls == 2);
  CHECK(tally.flops == 2 * flops);
  CHECK(tally.tensor_flops == 6 * flops);  // FP32 weights: six BF16 products
  const std::vector<double> t = intervals.collect();
  REQUIRE(t.size() == 3);
  CHECK(t[0] == 0.0);
  CHECK(t[1] == 0.0);
  CHECK(t[2] > 0.0);
  CHECK(intervals.collect()[2] == 0.0);  // collected intervals are forgotten
  CHECK_THROWS_AS(intervals.begin(3, nullptr), std::invalid_argument);
  CHECK_THROWS_AS(intervals.end(0, nullptr), std::logic_error);
  intervals.begin(0, nullptr);
  CHECK_THROWS_AS(intervals.collect(), std::logic_error);
  intervals.clear();  // the open interval forgotten
  CHECK(intervals.collect()[0] == 0.0);
}

namespace {
// The matrix elements of every projection of the model's blocks (what GpuCausalLM::final_hidden
// multiplies: 2 N per element), the LM head and embeddings excluded.
double projection_elements(const model::CausalLM& lm) {
  double n = 0;
  auto add = [&](const model::Linear& l) { n += static_cast<double>(l.weight.size()); };
  auto block = [&](const model::Block* b) {
    if (const auto* m = dynamic_cast<const model::Mamba2Mixer*>(b)) {
      add(m->in_proj());
      add(m->out_proj());
    } else if (const auto* g = dynamic_cast<const model::GatedDeltaNet*>(b)) {
      for (const model::Linear* l : {&g->in_proj_qkv(), &g->in_proj_z(), &g->in_proj_b(), &g->in_proj_a(), &g->out_proj()})
        add(*l);
    } else if (const auto* a = dynamic_cast<const model::Attention*>(b)) {
      for (const model::Linear* l : {&a->q_proj(), &a->k_proj(), &a->v_proj(), &a->o_proj()}) add(*l);
    } else if (const auto* p = dynamic_cast<const model::Mlp*>(b)) {
      for (const model::Linear* l : {&p->gate_proj(), &p->up_proj(), &p->down_proj()}) add(*l);
    } else {
      FAIL("a block without a GPU twin");
    }
  };
  for (const auto& L : lm.layer_blocks()) {
    block(L.mixer.get());
    if (L.mlp) block(L.mlp.get());
  }
  return n;
}
}  // namespace

TEST_CASE("GpuCausalLM::set_timing: the same hidden states, every part timed and inside the total, FLOPs from the shapes") {
  for (const char* name : {"qwen3_5_tiny", "nemotron_h_tiny"}) {
    CAPTURE(name);
    const model::CausalLM lm = model::CausalLM::load(test::source_path(std::string("data/models/") + name));
    for (const GemmPrecision p : {GemmPrecision::fp32, GemmPrecision::bf16x3}) {
      CAPTURE(static_cast<int>(p));
      GpuCausalLM g(lm, p);
      const int n = 300;
      std::vector<int32_t> tokens(n);
      for (int i = 0; i < n; ++i) tokens[static_cast<std::size_t>(i)] = (i * 37 + 11) % g.vocab_size();
      const model::PolicyAssignment policy(ssm::PrecisionPolicy::parse("shared:nvfp4+sr@16"));
      DeviceMatrixBuffer plain(n, g.hidden_size()), timed(n, g.hidden_size());
      g.final_hidden(tokens, policy, plain.view());
      g.set_timing(true);
      g.final_hidden(tokens, policy, timed.view());
      REPLAYSSM_CUDA_CHECK(cudaStreamSynchronize(g.stream()));
      const std::vector<float> a = to_host(plain.view()), b = to_host(timed.view());
      CHECK(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);  // timing changes no number

      const GpuForwardTiming& t = g.last_timing();
      MESSAGE(name << ": total " << t.total << " s, attention layers " << t.attention_layers << " (GEMMs "
                   << t.attention_gemm << "), SSM layers " << t.ssm_layers << " (GEMMs " << t.ssm_gemm << "), MLP "
                   << t.mlp_layers << " (GEMMs " << t.mlp_gemm << "), " << t.gemm_calls << " GEMM calls");
      CHECK(t.total > 0);
      CHECK(t.attention_layers > 0);
      CHECK(t.ssm_layers > 0);
      CHECK(t.mlp_layers > 0);
      // Nested intervals: each GEMM inside its layer, the layers inside the total (event resolution ~0.5 us each).
      const double slack = 1e-6 * static_cast<double>(t.gemm_calls + 2 * lm.layer_blocks().size());
      CHECK(t.attention_gemm > 0);
      CHECK(t.attention_gemm <= t.attention_layers + slack);
      CHECK(t.ssm_gemm <= t.ssm_layers + slack);
      CHECK(t.mlp_gemm <= t.mlp_layers + slack);
      CHECK(t.attention_layers + t.ssm_layers + t.mlp_layers <= t.total + slack);
      CHECK(t.gemm_calls > 0);
      CHECK(t.gemm_flops == doctest::Approx(2.0 * n * projection_elements(lm)).epsilon(1e-12));
      // fp32: no tensor-core work; bf16x3: 3 BF16 products per product FLOP (BF16 weights), else 6.
      if (p == GemmPrecision::fp32) CHECK(t.gemm_tensor_flops == 0.0);
      if (p == GemmPrecision::bf16x3) {
        CHECK(t.gemm_tensor_flops >= 3 * t.gemm_flops);
        CHECK(t.gemm_tensor_flops <= 6 * t.gemm_flops);
      }
      const model::AttentionShape& s = lm.config().attention;
      CHECK(t.attention_flops == doctest::Approx(lm.config().attention_layer_count() * double(s.num_heads) * n * (n + 1) *
                                                 2.0 * s.head_dim));
    }
  }
}
