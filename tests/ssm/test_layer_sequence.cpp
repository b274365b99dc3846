// The canonical FP32 dot product (ssm/canonical_dot.h) and the whole-layer emulator
// (ssm::emulate_layer_sequence, the CPU twin of the CUDA layer scan): the layer emulator equals one
// emulate_sequence call per key head group bit for bit, outputs and checkpoints, on strided inputs.
#include <doctest/doctest.h>

#include <boost/random/mersenne_twister.hpp>
#include <boost/random/normal_distribution.hpp>
#include <cmath>
#include <cstring>
#include <map>
#include <stdexcept>
#include <vector>

#include "ssm/canonical_dot.h"
#include "ssm/recurrence.h"
#include "ssm_test_data.h"

using namespace replayssm;
using namespace replayssm::ssm;

namespace {

// The canonical order written out independently: lane sums in a 32 x ceil(n/32) table, then the
// tree level by level into a fresh array.
float lane_table_dot(const std::vector<float>& x, const std::vector<float>& y) {
  std::vector<float> lane(32, 0.0f);
  for (std::size_t j = 0; j < x.size(); ++j) {
    const float p = x[j] * y[j];
    lane[j % 32] = lane[j % 32] + p;
  }
  for (int width = 16; width >= 1; width /= 2) {
    std::vector<float> next(static_cast<std::size_t>(width));
    for (int l = 0; l < width; ++l) next[l] = lane[l] + lane[l + width];
    lane = next;
  }
  return lane[0];
}

bool same_bits(float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0; }

}  // namespace

TEST_CASE("canonical_dot: the documented lane order, for every length; the recurrences use it") {
  boost::random::mt19937_64 rng(test::kBaseSeed * 1000 + 900);
  boost::random::normal_distribution<float> normal(0.0f, 1.0f);
  int differs_from_sequential = 0;
  for (int n = 1; n <= 300; ++n) {
    std::vector<float> x(n), y(n);
    for (int j = 0; j < n; ++j) x[j] = normal(rng), y[j] = normal(rng) * 1e3f;
    const float c = canonical_dot(x.data(), y.data(), n);
    CAPTURE(n);
    CHECK(same_bits(c, lane_table_dot(x, y)));
    double exact = 0, mag = 0;
    float sequential = 0.0f;
    for (int j = 0; j < n; ++j) {
      exact += double(x[j]) * y[j];
      mag += std::abs(double(x[j]) * y[j]);
      sequential += x[j] * y[j];
    }
    CHECK(std::abs(c - exact) <= 1e-6 * mag);
    differs_from_sequential += !same_bits(c, sequential);
  }
  CHECK(differs_from_sequential > 0);  // the order matters, so it is worth fixing

  // correction (gdn, kda) and state_output: one canonical dot per state row.
  const int dv = 5, dk = 70;
  StateMatrix S(dv, dk);
  Vector q(dk), k(dk), a(dk), v(dv), u, o;
  for (int i = 0; i < dv; ++i)
    for (int c = 0; c < dk; ++c) S(i, c) = normal(rng);
  for (int c = 0; c < dk; ++c) q(c) = normal(rng), k(c) = normal(rng), a(c) = 0.5f + 0.01f * c;
  for (int i = 0; i < dv; ++i) v(i) = normal(rng);
  StepScratch scratch;
  state_output(S, q, o);
  correction(Recurrence::gdn, S, a.head(1), 0.7f, v, k, u, scratch);
  Vector ak(dk);
  for (int c = 0; c < dk; ++c) ak(c) = a(c) * k(c);
  Vector u_kda;
  correction(Recurrence::kda, S, a, 0.7f, v, k, u_kda, scratch);
  for (int i = 0; i < dv; ++i) {
    CHECK(same_bits(o(i), canonical_dot(S.row(i).data(), q.data(), dk)));
    const float sk = canonical_dot(S.row(i).data(), k.data(), dk);
    CHECK(same_bits(u(i), 0.7f * (v(i) - a(0) * sk)));
    const float sak = canonical_dot(S.row(i).data(), ak.data(), dk);
    CHECK(same_bits(u_kda(i), 0.7f * (v(i) - sak)));
  }
}

namespace {

// A layer's inputs in the projections' layout (token rows, heads side by side, padded rows).
struct LayerData {
  LayerSequence seq;
  std::vector<float> q, k, alpha, beta, v, out;
  std::vector<test::GroupData> groups;  // the same values, one GroupData per key head
};

LayerData make_layer(Recurrence kind, int n, int dk, int dv, int key_heads, int G, uint64_t seed) {
  LayerData L;
  const int H = key_heads * G, w = decay_width(kind, dk);
  const bool delta = has_delta_rule(kind);
  for (int g = 0; g < key_heads; ++g)
    L.groups.push_back(test::make_group_data({kind, dk, dv, G}, n, 0.97f, 1.0f, seed + static_cast<uint64_t>(g)));
  LayerSequence& s = L.seq;
  s.kind = kind, s.n_tokens = n, s.dk = dk, s.dv = dv, s.n_key_heads = key_heads, s.n_value_heads = H;
  s.ld_q = key_heads * dk + 3, s.ld_k = key_heads * dk + 7, s.ld_alpha = H * w + 1, s.ld_beta = H + 2;
  s.ld_v = H * dv + 5, s.ld_out = H * dv + 9;
  const std::size_t N = static_cast<std::size_t>(n);
  L.q.assign(N * s.ld_q, NAN), L.k.assign(N * s.ld_k, NAN), L.alpha.assign(N * s.ld_alpha, NAN);
  L.v.assign(N * s.ld_v, NAN), L.out.assign(N * s.ld_out, -7.0f);
  if (delta) L.beta.assign(N * s.ld_beta, NAN);
  for (std::size_t t = 0; t < N; ++t)
    for (int kh = 0; kh < key_heads; ++kh) {
      const test::GroupData& d = L.groups[kh];
      for (int c = 0; c < dk; ++c) {
        L.q[t * s.ld_q + kh * dk + c] = d.q[t * dk + c];
        L.k[t * s.ld_k + kh * dk + c] = d.k[t * dk + c];
      }
      for (int g = 0; g < G; ++g) {
        const int h = kh * G + g;
        for (int c = 0; c < w; ++c) L.alpha[t * s.ld_alpha + h * w + c] = d.alpha[g][t * w + c];
        for (int r = 0; r < dv; ++r) L.v[t * s.ld_v + h * dv + r] = d.v[g][t * dv + r];
        if (delta) L.beta[t * s.ld_beta + h] = d.beta[g][t];
      }
    }
  s.q = L.q.data(), s.k = L.k.data(), s.alpha = L.alpha.data(), s.v = L.v.data(), s.out = L.out.data();
  s.beta = delta ? L.beta.data() : nullptr;
  return L;
}

using Checkpoints = std::map<std::pair<int, int64_t>, std::vector<float>>;  // (value head, token) -> recur|read

}  // namespace

TEST_CASE("emulate_layer_sequence == one emulate_sequence per key head group, bit for bit (strided inputs)") {
  const char* policies[] = {"conv:fp16+sr,seed=4", "shared:nvfp4+sr@5,seed=5", "split:nvfp4/fp16+sr@4,seed=6",
                            "shared:fp32@7"};
  uint64_t seed = test::kBaseSeed * 1000 + 950;
  for (Recurrence kind : {Recurrence::mamba2, Recurrence::gdn, Recurrence::kda}) {
    for (const char* text : policies) {
      const PrecisionPolicy p = PrecisionPolicy::parse(text);
      const int n = 53, dk = 32, dv = 12, key_heads = 3, G = 2;  // 53 = no multiple of any window
      LayerData L = make_layer(kind, n, dk, dv, key_heads, G, seed += 10);
      const uint32_t layer = 6;
      CAPTURE(to_string(kind));
      CAPTURE(text);
      Checkpoints layer_ck, group_ck;
      auto record = [&](Checkpoints& into, int head_offset) {
        return [&into, head_offset, dv, dk](int h, int64_t t, const float* recur, const float* read) {
          std::vector<float> v(recur, recur + dv * dk);
          if (read) v.insert(v.end(), read, read + dv * dk);
          into[{head_offset + h, t}] = std::move(v);
        };
      };
      EmulatorOptions opt;
      opt.on_checkpoint = record(layer_ck, 0);
      emulate_layer_sequence(L.seq, p, layer, opt);
      for (int kh = 0; kh < key_heads; ++kh) {
        EmulatorOptions gopt;
        gopt.on_checkpoint = record(group_ck, kh * G);
        const test::Outputs ref = test::run_emulator(L.groups[kh], p, {layer, static_cast<uint32_t>(kh)}, gopt);
        for (int g = 0; g < G; ++g) {
          const int h = kh * G + g;
          int differ = 0;
          for (int t = 0; t < n; ++t)
            for (int r = 0; r < dv; ++r)
              differ += !same_bits(L.out[static_cast<std::size_t>(t) * L.seq.ld_out + h * dv + r],
                                   ref[g][static_cast<std::size_t>(t) * dv + r]);
          CAPTURE(h);
          CHECK(differ == 0);
        }
      }
      CHECK(layer_ck.size() == key_heads * G * quantization_events(p, n));
      CHECK(layer_ck == group_ck);
      // Padding between rows is never written.
      for (std::size_t t = 0; t < static_cast<std::size_t>(n); ++t)
        for (int64_t c = key_heads * G * dv; c < L.seq.ld_out; ++c) CHECK(L.out[t * L.seq.ld_out + c] == -7.0f);
      // Threads over groups change nothing.
      std::vector<float> first = L.out;
      EmulatorOptions threaded;
      threaded.max_threads = 2;
      emulate_layer_sequence(L.seq, p, layer, threaded);
      CHECK(std::memcmp(first.data(), L.out.data(), first.size() * sizeof(float)) == 0);
    }
  }
}

TEST_CASE("emulate_layer_sequence input validation") {
  LayerData L = make_layer(Recurrence::gdn, 10, 32, 8, 2, 2, test::kBaseSeed + 990);
  const PrecisionPolicy p = PrecisionPolicy::parse("shared:nvfp4@4");
  CHECK_NOTHROW(emulate_layer_sequence(L.seq, p, 0));
  auto invalid = [&](auto mutate, const PrecisionPolicy& policy = PrecisionPolicy::parse("shared:nvfp4@4")) {
    LayerSequence s = L.seq;
    mutate(s);
    return test::error_of<std::invalid_argument>([&] { emulate_layer_sequence(s, policy, 0); });
  };
  CHECK(test::contains(invalid([](LayerSequence& s) { s.n_value_heads = 3; }), "multiple"));
  CHECK(test::contains(invalid([](LayerSequence& s) { s.n_key_heads = 0; }), "multiple"));
  CHECK(test::contains(invalid([](LayerSequence& s) { s.ld_q = 63; }), "ld_q"));
  CHECK(test::contains(invalid([](LayerSequence& s) { s.ld_alpha = 3; }), "ld_alpha"));
  CHECK(test::contains(invalid([](LayerSequence& s) { s.ld_out = 31; }), "ld_out"));
  CHECK(test::contains(invalid([](LayerSequence& s) { s.v = nullptr; }), "v must be given"));
  CHECK(test::contains(invalid([](LayerSequence& s) { s.beta = nullptr; }), "beta must be given"));
  CHECK(test::contains(invalid([](LayerSequence& s) { s.kind = Recurrence::mamba2; }), "beta"));
  CHECK(test::contains(invalid([](LayerSequence& s) { s.n_tokens = -1; }), "n_tokens"));
  CHECK(test::contains(invalid([](LayerSequence& s) { s.dk = 0; }), "dk"));
  CHECK(test::contains(invalid([](LayerSequence&) {}, PrecisionPolicy::parse("conv:fp8b128")), "multiple of 128"));
  CHECK_THROWS_AS(emulate_layer_sequence(L.seq, p, 70000), std::out_of_range);
  LayerSequence many = L.seq;
  many.n_key_heads = 4096, many.n_value_heads = 4096;  // key head 4095 fits 12 bits
  many.n_tokens = 0;
  CHECK_NOTHROW(emulate_layer_sequence(many, p, 0));
  many.n_key_heads = 4097, many.n_value_heads = 4097;
  CHECK_THROWS_AS(emulate_layer_sequence(many, p, 0), std::out_of_range);
}
