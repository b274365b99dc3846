// Building blocks of the forward pass against direct (naive) formulas.
#include <doctest/doctest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>

#include "model/json_util.h"
#include "model/layers.h"
#include "model/tensor_ops.h"
#include "test_util.h"

using namespace replayssm::model;

namespace {
Mat random_mat(int r, int c, std::mt19937_64& g, float scale = 1.0f) {
  std::normal_distribution<float> n(0.0f, scale);
  Mat m(r, c);
  for (Eigen::Index i = 0; i < m.size(); ++i) m.data()[i] = n(g);
  return m;
}
}  // namespace

TEST_CASE("blocked online-softmax attention equals naive causal softmax attention (GQA)") {
  std::mt19937_64 g(replayssm::test::kBaseSeed + 41);
  for (int n : {1, 63, 64, 65, 200}) {
    CAPTURE(n);
    const int H = 6, Hkv = 2, hd = 8;
    const Mat q = random_mat(n, H * hd, g, 2.0f), k = random_mat(n, Hkv * hd, g, 2.0f), v = random_mat(n, Hkv * hd, g);
    const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
    for (int threads : {1, 3}) {
      const Mat out = causal_attention(q, k, v, {H, Hkv, hd, hd}, scale, ScaleAt::query, threads,
                                       /*block=*/16 + 48 * (threads == 1));
      double max_err = 0;
      for (int h = 0; h < H; ++h) {
        const int kvh = h / (H / Hkv);
        for (int t = 0; t < n; ++t) {
          std::vector<double> s(t + 1);
          double mx = -1e300, sum = 0;
          for (int j = 0; j <= t; ++j) {
            double d = 0;
            for (int i = 0; i < hd; ++i) d += static_cast<double>(q(t, h * hd + i)) * k(j, kvh * hd + i);
            s[j] = d * scale;
            mx = std::max(mx, s[j]);
          }
          for (int j = 0; j <= t; ++j) sum += s[j] = std::exp(s[j] - mx);
          for (int i = 0; i < hd; ++i) {
            double o = 0;
            for (int j = 0; j <= t; ++j) o += s[j] / sum * v(j, kvh * hd + i);
            max_err = std::max(max_err, std::abs(o - out(t, h * hd + i)));
          }
        }
      }
      CHECK(max_err < 2e-5);
    }
  }
}

TEST_CASE("causal depthwise conv1d + SiLU matches the direct sum; linear matches Eigen for any split") {
  std::mt19937_64 g(replayssm::test::kBaseSeed + 42);
  const int n = 77, ch = 150, kk = 4;
  const Mat x0 = random_mat(n, ch, g), w = random_mat(ch, kk, g);
  const Vec b = random_mat(ch, 1, g);
  for (int threads : {1, 2, 5}) {
    Mat x = x0;
    causal_conv1d_silu(x, w, b, threads);
    double err = 0;
    for (int t = 0; t < n; ++t)
      for (int c = 0; c < ch; ++c) {
        double acc = b[c];
        for (int j = 0; j < kk; ++j) {
          const int src = t - (kk - 1) + j;
          if (src >= 0) acc += static_cast<double>(w(c, j)) * x0(src, c);
        }
        err = std::max(err, std::abs(acc / (1 + std::exp(-acc)) - x(t, c)));
      }
    CHECK(err < 1e-5);
  }
  Linear l;
  l.weight = random_mat(300, 40, g);
  l.bias = random_mat(300, 1, g);
  for (int rows : {1, 5, 100}) {
    const Mat in = random_mat(rows, 40, g);
    const Mat want = (in * l.weight.transpose()).rowwise() + l.bias.transpose();
    for (int threads : {1, 2, 4}) {
      Mat y;
      l.apply(in, y, threads);
      CHECK((y - want).cwiseAbs().maxCoeff() < 1e-4);
    }
  }
}

TEST_CASE("RMSNorm variants: plain, (1 + w), grouped") {
  std::mt19937_64 g(replayssm::test::kBaseSeed + 43);
  const Mat x0 = random_mat(5, 12, g);
  const Vec w = random_mat(12, 1, g);
  for (bool plus_one : {false, true})
    for (int group : {12, 4}) {
      Mat x = x0;
      rms_norm_rows(x, w, 1e-6f, plus_one, group, 2);
      for (int r = 0; r < 5; ++r)
        for (int g0 = 0; g0 < 12; g0 += group) {
          double ms = 0;
          for (int i = 0; i < group; ++i) ms += static_cast<double>(x0(r, g0 + i)) * x0(r, g0 + i) / group;
          for (int i = 0; i < group; ++i) {
            const double want = x0(r, g0 + i) / std::sqrt(ms + 1e-6) * (plus_one ? 1 + w[g0 + i] : w[g0 + i]);
            CHECK(x(r, g0 + i) == doctest::Approx(want).epsilon(1e-5));
          }
        }
    }
}

TEST_CASE("JSON helpers: Python literals, transformers' __float__, typed errors") {
  const auto tmp = std::filesystem::temp_directory_path() / "replayssm_json_util_test.json";
  {
    std::ofstream f(tmp);
    f << R"({"a": [0.0, Infinity, -Infinity], "s": "Infinity inside a string", "b": {"__float__": "Infinity"},
             "n": NaN, "i": 3, "f": 2.5})";
  }
  const JsonObject j(read_json_file(tmp.string()), tmp.string());
  const auto a = j.get_double_list("a");
  CHECK(a[0] == 0.0);
  CHECK(std::isinf(a[1]));
  CHECK(a[2] < 0);
  CHECK(std::isinf(a[2]));
  CHECK(j.get_string("s") == "Infinity inside a string");
  CHECK(std::isinf(j.get_double("b")));
  CHECK(std::isnan(j.get_double("n")));
  CHECK(j.get_int("i") == 3);
  CHECK(j.get_int("missing", 7) == 7);
  CHECK_THROWS_WITH(j.get_int("f"), doctest::Contains("config key \"f\" is 2.5, expected an integer"));
  CHECK_THROWS_WITH(j.get_int("zz"), doctest::Contains("missing config key \"zz\""));
  CHECK_THROWS_WITH(j.get_int("zz"), doctest::Contains(tmp.string().c_str()));
  std::filesystem::remove(tmp);
}
