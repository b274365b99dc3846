// The GPU forward's ops (cuda/model/model_ops.h) and GpuLinear (linear_gpu.h) against their CPU
// twins on fresh random inputs (fixed seeds, never all zeros), awkward shapes: 1 row, fewer rows than
// the conv kernel, widths that are not multiples of 32, strided column blocks of wider matrices
// (and the columns around them must come back untouched). Tolerances (test_util.h compare_close):
// element-wise and row-wise ops |gpu - cpu| <= 1e-6 (rms + |cpu|) (the GPU's expf/log1pf are within
// 2 ulp of glibc's; sums of squares are in double on both sides); FP32 GEMM 1e-5 (rms + |cpu|) (the
// summation order differs). BF16 products: the measured error against the CPU's FP32 product is
// printed and bounded by the a-priori bound of linear_gpu.h per element. Skips (77) without a GPU.
#include <doctest/doctest.h>

#include <boost/random/mersenne_twister.hpp>
#include <boost/random/normal_distribution.hpp>
#include <boost/random/uniform_int_distribution.hpp>
#include <boost/random/uniform_real_distribution.hpp>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "cuda_check.h"
#include "model/linear_gpu.h"
#include "model/model_ops.h"
#include "test_util.h"

using namespace replayssm;
using namespace replayssm::cuda;
using model::Mat;
using model::Vec;

namespace {

struct GpuGuard {
  GpuGuard() {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0)
      test::skip_suite("no CUDA device: model op tests run on the device machine (see docs/GPU_RESULTS.md)");
  }
};
const GpuGuard gpu_guard;

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
    REQUIRE(cublasCreate(&h) == CUBLAS_STATUS_SUCCESS);
    REQUIRE(cublasSetMathMode(h, CUBLAS_DEFAULT_MATH) == CUBLAS_STATUS_SUCCESS);
  }
  ~Cublas() { cublasDestroy(h); }
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
  REQUIRE(cublasSetMathMode(blas.h, CUBLAS_TF32_TENSOR_OP_MATH) == CUBLAS_STATUS_SUCCESS);
  CHECK_THROWS_WITH_AS(gpu.apply(x.gpu(), y.gpu(), ctx), doctest::Contains("math mode"), std::logic_error);
}

TEST_CASE("GpuLinear bf16x3 and bf16 against the FP32 product: errors printed and within their bounds") {
  Rng rng(9);
  Cublas blas;
  const double u = std::ldexp(1.0, -8);
  for (const bool bf16_weights : {false, true}) {
    for (const int rows : {3, 5000}) {  // 5000 > kSplitRows: x is split in two blocks
      CAPTURE(bf16_weights); CAPTURE(rows);
      const int in = 130, out = 70;
      model::Linear cpu;
      cpu.weight = rng.normal(out, in, 1.0f / std::sqrt(float(in)));
      if (bf16_weights)  // a BF16 checkpoint: every weight a BF16 value
        for (Eigen::Index i = 0; i < cpu.weight.size(); ++i)
          cpu.weight.data()[i] = __bfloat162float(__float2bfloat16_rn(cpu.weight.data()[i]));
      cpu.bias = rng.vec(out, -1.0f, 1.0f);
      Wide x(rng, rows, in, 0, 6, 2.0f);
      const Mat xs = x.host.middleCols(0, in);
      Mat ref;
      cpu.apply(xs, ref, 1);
      const Mat a = abs_products(xs, cpu.weight);
      const GpuLinear gpu(cpu, GemmPrecision::bf16x3);
      // bf16x3: 3 u^2 (1 + u)^2 a (u^2 a with BF16 weights) + FP32 accumulation and the bias add.
      const double fp32_slack = (in + 2) * std::ldexp(1.0, -24);
      double worst[2] = {0, 0};
      for (const GemmPrecision p : {GemmPrecision::bf16x3, GemmPrecision::bf16}) {
        const int pi = p == GemmPrecision::bf16x3 ? 0 : 1;
        const double bound = pi == 0 ? (bf16_weights ? u * u : 3 * u * u * (1 + u) * (1 + u)) : 2 * u + u * u;
        Wide y(rng, rows, out, 0, 1);
        gpu.apply(x.gpu(), y.gpu(), GpuContext{nullptr, blas.h, p, 0, nullptr});
        const std::vector<float> got = y.back();
        std::size_t over = 0;
        for (Eigen::Index r = 0; r < rows; ++r)
          for (Eigen::Index c = 0; c < out; ++c) {
            const double g = got[static_cast<std::size_t>(r * (out + 1) + c)];
            const double d = std::abs(g - ref(r, c)), allowed = (bound + fp32_slack) * a(r, c) + 1e-6 * std::abs(ref(r, c));
            worst[pi] = std::max(worst[pi], d / a(r, c));
            if (d > allowed) ++over;
          }
        CHECK(over == 0);
      }
      MESSAGE((bf16_weights ? "BF16 weights" : "FP32 weights") << ", " << rows << " rows: max |y - y_fp32| / sum|x||W|: "
                                                                << "bf16x3 " << worst[0] << ", bf16 " << worst[1]
                                                                << " (u^2 = " << u * u << ", u = " << u << ")");
      CHECK(worst[0] < worst[1] / 20);  // the split buys ~8 more bits
      CHECK(gpu.weight_bytes() > 4 * int64_t{out} * (in + 1));  // the BF16 parts were made
    }
  }
}
