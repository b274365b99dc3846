// Analytic models of appendix C (ssm/analytic_model.h) against the paper's numbers, computed from
// the shape data (ssm/model_shapes.h), and the replay traffic formula against a literal byte count:
// Algorithms 1, 3 and 4 run on random inputs against a memory that counts every byte loaded or
// stored, with outputs checked against the conventional recurrence (so the count is that of a
// working decoder, not of a restatement of the formula).
#include <doctest/doctest.h>

#include <boost/random/mersenne_twister.hpp>
#include <boost/random/normal_distribution.hpp>
#include <boost/random/uniform_real_distribution.hpp>
#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include "formats/quantized_matrix.h"
#include "ssm/analytic_model.h"
#include "ssm/model_shapes.h"
#include "test_util.h"

using namespace replayssm;
using namespace replayssm::ssm;
using formats::StorageFormat;

// ---- the paper's numbers ------------------------------------------------------------------------

TEST_CASE("paper shapes: section 8 table and lookup") {
  REQUIRE(paper_shapes().size() == 5);  // the paper's four, then Kimi Linear (KDA, beyond the paper)
  const ModelShape& s = find_shape("nemotron-3-super");
  CHECK(s.name == "Nemotron-3-Super-120B-A12B");
  CHECK(s.kind == Recurrence::mamba2);
  CHECK(s.ssm_layers == 40);
  CHECK(s.attention_layers == 8);
  CHECK(s.key_heads == 8);
  CHECK(s.value_heads == 128);
  CHECK(s.dk == 128);
  CHECK(s.dv == 64);
  CHECK(&find_shape("Nemotron-3-Super-120B-A12B") == &s);
  CHECK(&find_shape("NEMOTRON-3-SUPER") == &s);
  CHECK(find_shape("nemotron-3-nano-4b").dv == 80);
  CHECK(find_shape("qwen3.5-4b").kind == Recurrence::gdn);
  CHECK(find_shape("qwen3.5-122b-a10b").value_heads == 64);
  const ModelShape& kimi = find_shape("Kimi-Linear-48B-A3B");
  CHECK(kimi.kind == Recurrence::kda);
  CHECK(kimi.ssm_layers == 20);
  CHECK(kimi.attention_layers == 7);
  CHECK(kimi.key_heads == 32);
  CHECK(kimi.value_heads == 32);
  CHECK(kimi.dk == 128);
  CHECK(kimi.dv == 128);
  CHECK(!kimi.kv_bytes_per_token);
  // KDA records carry dk fp32 decays: (alpha, u, k) = 2dv + 6dk, split (alpha, beta, u, v, k) = 4dv + 6dk + 4.
  CHECK(record_bytes(Recurrence::kda, false, 128, 128) == 2u * 128 + 6 * 128);
  CHECK(record_bytes(Recurrence::kda, true, 128, 128) == 4u * 128 + 6 * 128 + 4);
  CHECK(layer_record_bytes(kimi, false, true) == 32u * (2 * 128 + 6 * 128));
  try {
    find_shape("mamba-7b");
    FAIL("expected std::invalid_argument");
  } catch (const std::invalid_argument& e) {
    const std::string what = e.what();
    CHECK(what.find("mamba-7b") != std::string::npos);
    for (const ModelShape& known : paper_shapes()) CHECK(what.find(std::string(known.short_name)) != std::string::npos);
  }
}

TEST_CASE("Nemotron-3-Super, L = 16: replay moves 0.58x the bytes of conventional decode") {
  const ModelShape& s = find_shape("nemotron-3-super");
  const uint64_t M = state_bytes(s.dv, s.dk, StorageFormat::fp32);
  const uint64_t r = record_bytes(s.dv, s.dk);
  CHECK(M == 4u * 64 * 128);
  CHECK(r == 2u * 64 + 2 * 128 + 4);
  const Traffic conv = conventional_window_traffic(M, 16);
  const Traffic rep = replay_window_traffic(M, r, 16);
  CHECK(conv.total() == 8u * 16 * 64 * 128);                             // M_conv = 8 L dv dk
  CHECK(rep.total() == 4u * 17 * 64 * 128 + 15 * 18 / 2 * r);            // M_replay at FP32
  CHECK(rep.state_read == 16 * M);
  CHECK(rep.state_write == M);
  const double ratio = static_cast<double>(rep.total()) / static_cast<double>(conv.total());
  MESSAGE("replay / conventional = " << ratio);
  CHECK(std::fabs(ratio - 0.58) < 0.005);
  // Checkpoint terms alone: (L+1)/2L = 17/32 ~ 0.53 (paper section 3.1).
  CHECK(static_cast<double>(rep.state()) / static_cast<double>(conv.total()) == doctest::Approx(17.0 / 32.0));
  // Per layer (paper accounting: value heads x per head) the ratio is the same.
  const Traffic layer = replay_window_traffic(layer_state_bytes(s, StorageFormat::fp32), layer_record_bytes(s, false, false), 16);
  CHECK(layer.total() == rep.total() * 128);
  // Storing k once per key head only lowers it.
  const Traffic shared = replay_window_traffic(layer_state_bytes(s, StorageFormat::fp32), layer_record_bytes(s, false, true), 16);
  CHECK(shared.total() < layer.total());
  CHECK(layer_record_bytes(s, false, true) == 128u * (2 * 64 + 4) + 8u * 2 * 128);
}

TEST_CASE("optimal window: L* ~ 13 standard, ~ 24 speculative (T = 4, a = 3.5), M_S/r ~ 84") {
  const ModelShape& s = find_shape("nemotron-3-super");
  const double M = static_cast<double>(state_bytes(s.dv, s.dk, StorageFormat::fp32));
  const double r = static_cast<double>(record_bytes(s.dv, s.dk));
  CHECK(std::lround(M / r) == 84);
  const double standard = optimal_window(M, r);             // a = T = 1
  const double standard_t0 = optimal_window(M, r, 1.0, 0.0);  // the T = 0 reading
  const double speculative = optimal_window(M, r, 3.5, 4.0);
  MESSAGE("L* standard " << standard << " (T = 0: " << standard_t0 << "), speculative " << speculative);
  CHECK(std::lround(standard) == 13);
  CHECK(std::lround(standard_t0) == 13);
  CHECK(std::lround(speculative) == 24);

  // f(L) at a = T = 1 is the C.3 window traffic per token, exactly.
  for (int L : {1, 2, 5, 13, 16, 64})
    CHECK(per_token_traffic(L, M, r) ==
          doctest::Approx(static_cast<double>(replay_window_traffic(static_cast<uint64_t>(M), static_cast<uint64_t>(r), L).total()) / L)
              .epsilon(1e-12));
  // L* is the minimiser of f: scan f on a fine grid.
  for (auto [a, T] : {std::pair{1.0, 1.0}, std::pair{3.5, 4.0}, std::pair{2.0, 8.0}, std::pair{1.0, 0.0}}) {
    double best_L = 0, best_f = INFINITY;
    for (double L = 1.0; L <= 200.0; L += 1e-3) {
      const double f = per_token_traffic(L, M, r, a, T);
      if (f < best_f) best_f = f, best_L = L;
    }
    CHECK(best_L == doctest::Approx(optimal_window(M, r, a, T)).epsilon(1e-3));
  }
  // The integer window that minimises the exact standard-decode traffic is 13 as well.
  int best = 0;
  double best_bytes = INFINITY;
  for (int L = 1; L <= 64; ++L) {
    const double per_token =
        static_cast<double>(replay_window_traffic(static_cast<uint64_t>(M), static_cast<uint64_t>(r), L).total()) / L;
    if (per_token < best_bytes) best_bytes = per_token, best = L;
  }
  CHECK(best == 13);
  CHECK_THROWS_AS(optimal_window(M, r, 1.0, 100.0), std::invalid_argument);
  CHECK_THROWS_AS(optimal_window(M, r, 0.0, 1.0), std::invalid_argument);
}

TEST_CASE("SSM vs attention crossover: Nemotron-3-Super ~ 82K tokens") {
  const ModelShape& s = find_shape("nemotron-3-super");
  CHECK(layer_state_bytes(s, StorageFormat::fp32) == 4u << 20);                 // 4 MiB per layer per sequence
  CHECK(model_ssm_conventional_step_bytes(s, StorageFormat::fp32) == 320u << 20);  // 40 x 8 MiB
  REQUIRE(s.kv_bytes_per_token.has_value());
  CHECK(*s.kv_bytes_per_token == 2 * 2 * 128 * 1);  // 2 KV heads x {K,V} x 128 x 1 B FP8
  const double n = crossover_context_tokens(static_cast<double>(model_ssm_conventional_step_bytes(s, StorageFormat::fp32)),
                                            s.attention_layers, *s.kv_bytes_per_token);
  MESSAGE("crossover = " << n << " tokens");
  CHECK(n == 81920.0);
  CHECK(std::lround(n / 1000) == 82);
  for (const ModelShape& other : paper_shapes())
    if (&other != &s) CHECK_FALSE(other.kv_bytes_per_token.has_value());  // not given by the paper
  CHECK_THROWS_AS(crossover_context_tokens(1e6, 0, 512), std::invalid_argument);
  CHECK_THROWS_AS(crossover_context_tokens(1e6, 8, 0), std::invalid_argument);
}

TEST_CASE("FLOPs and arithmetic intensity (C.1, C.4)") {
  const int dv = 64, dk = 128;
  CHECK(conventional_step_flops(dv, dk) == 5.0 * dv * dk - dv);
  // Intensity ~ 5/(2b): 0.63 FLOP/byte at FP32, 1.25 at FP16.
  const double conv32 = conventional_step_flops(dv, dk) / static_cast<double>(2 * state_bytes(dv, dk, StorageFormat::fp32));
  const double conv16 = conventional_step_flops(dv, dk) / static_cast<double>(2 * state_bytes(dv, dk, StorageFormat::fp16));
  CHECK(conv32 == doctest::Approx(0.625).epsilon(0.01));
  CHECK(conv16 == doctest::Approx(1.25).epsilon(0.01));
  CHECK(materialised_step_flops(dv, dk, 5) == 2.0 * 8 * dv * dk);
  CHECK(output_only_step_flops(dv, dk, 5) == 2.0 * dv * dk + 2.0 * 6 * (dv + dk));
  // Each extra record costs 2 dv dk materialised vs 2(dv + dk) output-only: ~43x (paper C.4).
  const double per_record = (materialised_step_flops(dv, dk, 6) - materialised_step_flops(dv, dk, 5)) /
                            (output_only_step_flops(dv, dk, 6) - output_only_step_flops(dv, dk, 5));
  CHECK(std::lround(per_record) == 43);
  const WindowFlops w = window_flops(dv, dk, 16);
  CHECK(w.conventional == 16 * conventional_step_flops(dv, dk));
  double materialised = 0, output_only = 0;
  for (int h = 0; h < 16; ++h) {
    materialised += 2.0 * (h + 3) * dv * dk;
    output_only += h < 15 ? 2.0 * dv * dk + 2.0 * (h + 1) * (dv + dk) : 2.0 * (h + 3) * dv * dk;
  }
  CHECK(w.materialised == materialised);
  CHECK(w.output_only == output_only);
  CHECK(w.output_only < w.conventional);  // output-only replay does fewer FLOPs than conventional decode
}

TEST_CASE("speculative verification: prior schemes and ReplaySSM (Algorithm 2)") {
  const ModelShape& s = find_shape("nemotron-3-super");
  const auto schemes = prior_speculative_schemes(8);
  REQUIRE(schemes.size() == 6);
  CHECK(schemes[0].state_reads == 1);
  CHECK(schemes[0].state_writes == 8);  // vLLM: 1R + T W
  // Paper appendix A: at B = 256, T = 8, vLLM snapshots move 9.7 GB per layer per verify step;
  // ReplaySSM 1.1 GB (non-flush) and 2.1 GB (flush).
  const double batch_state = 256.0 * static_cast<double>(layer_state_bytes(s, StorageFormat::fp32));
  CHECK(std::lround(batch_state / 1e7) == 107);  // 1.07 GB
  CHECK(std::lround((schemes[0].state_reads + schemes[0].state_writes) * batch_state / 1e8) == 97);
  CHECK(std::lround(2 * batch_state / 1e8) == 21);
  CHECK(prior_speculative_schemes(4)[0].state_writes == 4);

  // a = T: h advances by T every step and the flush test h + T > L fires once every floor(L/T) steps.
  const SpeculativeReplayTraffic full = speculative_replay_traffic(16, 4, 4.0);
  CHECK(full.state_reads == doctest::Approx(1.0));
  CHECK(full.state_writes == doctest::Approx(1.0 / 4.0).epsilon(1e-4));
  CHECK(full.record_writes == doctest::Approx(4.0));
  CHECK(full.tokens == doctest::Approx(4.0).epsilon(1e-6));
  // h at the start of the steps of a cycle: 4, 8, 12, 16 -> mean 10 committed records read.
  CHECK(full.record_reads == doctest::Approx(10.0).epsilon(1e-4));
  // Mean acceptance 3.5 is honoured.
  const SpeculativeReplayTraffic partial = speculative_replay_traffic(16, 4, 3.5);
  CHECK(partial.tokens == doctest::Approx(3.5).epsilon(1e-5));
  CHECK(partial.state_writes > 0.2);
  CHECK(partial.state_writes < 0.3);
  // T = 1, a = 1: a flush every L steps, every record written, h = 1..L read.
  const SpeculativeReplayTraffic one = speculative_replay_traffic(16, 1, 1.0);
  CHECK(one.state_writes == doctest::Approx(1.0 / 16).epsilon(1e-4));
  CHECK(one.record_reads == doctest::Approx(17.0 / 2).epsilon(1e-4));

  CHECK_THROWS_AS(speculative_replay_traffic(16, 4, 4.5), std::invalid_argument);  // a > T
  CHECK_THROWS_AS(speculative_replay_traffic(16, 4, 0.5), std::invalid_argument);  // a < 1
  CHECK_THROWS_AS(speculative_replay_traffic(16, 0, 1.0), std::invalid_argument);  // T < 1
  CHECK_THROWS_AS(speculative_replay_traffic(2, 4, 1.0), std::invalid_argument);   // T > L
  CHECK_THROWS_AS(prior_speculative_schemes(0), std::invalid_argument);
}

TEST_CASE("bad input is rejected") {
  CHECK_THROWS_AS(conventional_window_traffic(100, 0), std::invalid_argument);
  CHECK_THROWS_AS(replay_window_traffic(100, 10, -1), std::invalid_argument);
  CHECK_THROWS_AS(split_window_traffic(100, 50, 10, 0), std::invalid_argument);
  CHECK_THROWS_AS(replay_record_traffic(10, 0), std::invalid_argument);
  CHECK_THROWS_AS(replay_nonflush_step_bytes(100, 10, 1), std::invalid_argument);
  CHECK_THROWS_AS(state_bytes(0, 128, StorageFormat::fp32), std::invalid_argument);
  CHECK_THROWS_AS(state_bytes(64, 100, StorageFormat::fp8b128), std::invalid_argument);  // 100 % 128
  CHECK_THROWS_AS(state_bytes(64, 40, StorageFormat::nvfp4), std::invalid_argument);     // 40 % 16
  CHECK_THROWS_AS(window_flops(64, 128, 0), std::invalid_argument);
}

TEST_CASE("low-precision state sizes use the formats' exact storage, scales included") {
  CHECK(state_bytes(64, 128, StorageFormat::fp16) == 2u * 64 * 128);
  CHECK(state_bytes(64, 128, StorageFormat::fp8b128) == 64u * 128 + 64 * 4);  // one fp32 scale per 128
  CHECK(state_bytes(64, 128, StorageFormat::nvfp4) == 64u * 128 / 2 + 64 * 128 / 16 + 4);
  CHECK(record_bytes(Recurrence::gdn, true, 128, 128) == 4u * 128 + 2 * 128 + 8);
  CHECK(record_bytes(Recurrence::gdn, false, 128, 128) == record_bytes(128, 128));
  CHECK(record_bytes(Recurrence::mamba2, true, 64, 128) == record_bytes(64, 128));
  const Traffic t = split_window_traffic(1000, 100, 10, 16);
  CHECK(t.state_read == 15u * 100 + 1000);
  CHECK(t.state_write == 1000u + 100);
  CHECK(t.records() == replay_record_traffic(10, 16));
  CHECK(replay_nonflush_step_bytes(1000, 10, 16) == doctest::Approx(1000 + 7 * 10 + 10));
  // With L = 1 ReplaySSM is conventional decode.
  CHECK(replay_window_traffic(1000, 10, 1).total() == conventional_window_traffic(1000, 1).total());
}

// ---- literal byte count of a working decoder ------------------------------------------------------

namespace {

// Row-major dv x dk state in float64, the "on-chip" working copy.
struct State {
  int dv = 0, dk = 0;
  std::vector<double> a;
  State(int v, int k) : dv(v), dk(k), a(static_cast<std::size_t>(v) * k, 0.0) {}
  double& at(int i, int j) { return a[static_cast<std::size_t>(i) * dk + j]; }
  double at(int i, int j) const { return a[static_cast<std::size_t>(i) * dk + j]; }
};

struct Token {
  double alpha = 0, beta = 0;
  std::vector<double> v, k, q;
};

std::vector<Token> random_tokens(int n, int dv, int dk, uint64_t seed) {
  boost::random::mt19937_64 rng(seed);
  boost::random::uniform_real_distribution<double> decay(0.6, 0.999), gate(0.05, 0.95);
  boost::random::normal_distribution<double> normal(0.0, 1.0);
  std::vector<Token> tokens(static_cast<std::size_t>(n));
  for (Token& t : tokens) {
    t.alpha = decay(rng);
    t.beta = gate(rng);
    t.v.resize(dv);
    t.k.resize(dk);
    t.q.resize(dk);
    for (double& x : t.v) x = normal(rng);
    double norm = 0;
    for (double& x : t.k) {
      x = normal(rng);
      norm += x * x;
    }
    for (double& x : t.k) x /= std::sqrt(norm);  // GDN: L2-normalised keys keep the delta rule stable
    for (double& x : t.q) x = normal(rng);
  }
  return tokens;
}

// S <- alpha S + u k^T, with u = v (Mamba-2) or u = beta (v - alpha S k) (GDN). Returns u.
std::vector<double> update(Recurrence kind, State& S, const Token& t) {
  std::vector<double> u = t.v;
  if (kind == Recurrence::gdn) {
    for (int i = 0; i < S.dv; ++i) {
      double sk = 0;
      for (int j = 0; j < S.dk; ++j) sk += S.at(i, j) * t.k[j];
      u[i] = t.beta * (t.v[i] - t.alpha * sk);
    }
  }
  for (int i = 0; i < S.dv; ++i)
    for (int j = 0; j < S.dk; ++j) S.at(i, j) = t.alpha * S.at(i, j) + u[i] * t.k[j];
  return u;
}

std::vector<double> output(const State& S, const std::vector<double>& q) {
  std::vector<double> o(static_cast<std::size_t>(S.dv), 0.0);
  for (int i = 0; i < S.dv; ++i)
    for (int j = 0; j < S.dk; ++j) o[i] += S.at(i, j) * q[j];
  return o;
}

// Conventional decode: the state after every token and the outputs.
void conventional(Recurrence kind, const std::vector<Token>& tokens, int dv, int dk, std::vector<State>& states,
                  std::vector<std::vector<double>>& outputs) {
  State S(dv, dk);
  for (const Token& t : tokens) {
    update(kind, S, t);
    states.push_back(S);
    outputs.push_back(output(S, t.q));
  }
}

// HBM as the decoder sees it: every load and store is counted, in the stored widths
// (state: its storage format; records: fp32 scalars, bf16 vectors).
struct CountingMemory {
  uint64_t state_read = 0, state_write = 0, record_read = 0, record_write = 0;
};

struct Record {  // what the buffer holds: (alpha, u, k), plus (beta, v) for GDN with two precisions
  double alpha, beta;
  std::vector<double> u, v, k;
};

struct ReplayRun {
  CountingMemory memory;
  std::vector<std::vector<double>> outputs;
  std::vector<State> hp_checkpoints;  // after each flush
};

// Algorithm 1 (Mamba-2) / 4 (GDN) with one checkpoint (lp_format == fp32 and !split), or the
// standard-decode form of Algorithm 3 (split): non-flush steps start from the low-precision copy,
// the flush starts from the high-precision copy (GDN: recomputing every u_j from it) and writes both.
ReplayRun replay(Recurrence kind, const std::vector<Token>& tokens, int dv, int dk, int L, bool split,
                 StorageFormat lp_format) {
  const uint64_t hp_bytes = 4ull * dv * dk;
  const uint64_t lp_bytes = formats::storage_bytes(lp_format, dv, dk);
  const bool keep_v = split && kind == Recurrence::gdn;
  const uint64_t rec_bytes = 4 /*alpha*/ + 2ull * dv /*u*/ + 2ull * dk /*k*/ + (keep_v ? 4 /*beta*/ + 2ull * dv /*v*/ : 0);
  ReplayRun run;
  State hp(dv, dk);
  std::vector<float> lp(static_cast<std::size_t>(dv) * dk, 0.0f);
  std::vector<Record> buffer;  // in memory
  for (const Token& t : tokens) {
    const int h = static_cast<int>(buffer.size());
    const bool flush = h + 1 == L;
    State S(dv, dk);
    if (split && !flush) {
      for (std::size_t i = 0; i < lp.size(); ++i) S.a[i] = lp[i];
      run.memory.state_read += lp_bytes;
    } else {
      S = hp;
      run.memory.state_read += hp_bytes;
    }
    for (const Record& rec : buffer) {  // REPLAY(S, B[1:h])
      run.memory.record_read += rec_bytes;
      Token replayed{rec.alpha, rec.beta, rec.u, rec.k, {}};
      if (keep_v && flush) {  // recompute u_j on the high-precision path
        replayed.v = rec.v;
        update(Recurrence::gdn, S, replayed);
      } else {
        update(Recurrence::mamba2, S, replayed);  // S <- alpha S + u k^T with the cached u
      }
    }
    // The current token: its record is produced on chip.
    const std::vector<double> u = update(kind, S, t);
    run.outputs.push_back(output(S, t.q));
    if (flush) {
      hp = S;
      run.memory.state_write += hp_bytes;
      if (split) {
        for (std::size_t i = 0; i < lp.size(); ++i) lp[i] = static_cast<float>(S.a[i]);
        formats::fake_quantize_matrix(lp.data(), dv, dk, lp_format, formats::Rounding::rtn);
        run.memory.state_write += lp_bytes;
      }
      run.hp_checkpoints.push_back(hp);
      buffer.clear();
    } else {
      buffer.push_back({t.alpha, t.beta, u, t.v, t.k});
      run.memory.record_write += rec_bytes;
    }
  }
  return run;
}

double max_abs(const std::vector<double>& x) {
  double m = 0;
  for (double v : x) m = std::max(m, std::fabs(v));
  return m;
}

}  // namespace

TEST_CASE("replay traffic formula = bytes counted while running Algorithms 1 and 4") {
  constexpr int kWindows = 3;
  uint64_t seed = test::kBaseSeed + 100;
  for (Recurrence kind : {Recurrence::mamba2, Recurrence::gdn}) {
    for (auto [dv, dk] : {std::pair{4, 8}, std::pair{8, 4}, std::pair{5, 3}, std::pair{16, 32}}) {
      for (int L : {1, 2, 3, 7, 16}) {
        CAPTURE(recurrence_name(kind));
        CAPTURE(dv);
        CAPTURE(dk);
        CAPTURE(L);
        const auto tokens = random_tokens(kWindows * L, dv, dk, ++seed);
        std::vector<State> states;
        std::vector<std::vector<double>> reference;
        conventional(kind, tokens, dv, dk, states, reference);
        const ReplayRun run = replay(kind, tokens, dv, dk, L, false, StorageFormat::fp32);
        // A working decoder: same outputs as conventional decode.
        for (std::size_t t = 0; t < tokens.size(); ++t)
          for (int i = 0; i < dv; ++i)
            REQUIRE(run.outputs[t][i] == doctest::Approx(reference[t][i]).epsilon(1e-9).scale(max_abs(reference[t])));
        // Its traffic, counted: kWindows windows of the closed form.
        const uint64_t M = state_bytes(dv, dk, StorageFormat::fp32);
        const uint64_t r = record_bytes(dv, dk);
        const Traffic w = replay_window_traffic(M, r, L);
        CHECK(run.memory.state_read == kWindows * w.state_read);
        CHECK(run.memory.state_write == kWindows * w.state_write);
        CHECK(run.memory.record_read == kWindows * w.record_read);
        CHECK(run.memory.record_write == kWindows * w.record_write);
        const uint64_t counted =
            run.memory.state_read + run.memory.state_write + run.memory.record_read + run.memory.record_write;
        // The paper's closed form, written out here as the spec states it.
        const uint64_t paper = 4ull * (L + 1) * dv * dk + static_cast<uint64_t>((L - 1) * (L + 2) / 2) * r;
        CHECK(counted == kWindows * paper);
        // Conventional decode: L reads + L writes per window.
        CHECK(conventional_window_traffic(M, L).total() == 2ull * L * M);
      }
    }
  }
}

TEST_CASE("split-precision traffic formula = bytes counted while running Algorithm 3 (standard decode)") {
  constexpr int kWindows = 3;
  uint64_t seed = test::kBaseSeed + 200;
  for (Recurrence kind : {Recurrence::mamba2, Recurrence::gdn}) {
    for (auto [dv, dk] : {std::pair{4, 16}, std::pair{6, 32}, std::pair{3, 128}}) {
      for (StorageFormat lp : {StorageFormat::fp16, StorageFormat::fp8b128, StorageFormat::nvfp4}) {
        if (dk % formats::block_size(lp) != 0) continue;
        for (int L : {1, 2, 5, 16}) {
          CAPTURE(recurrence_name(kind));
          CAPTURE(dv);
          CAPTURE(dk);
          CAPTURE(formats::to_string(lp));
          CAPTURE(L);
          const auto tokens = random_tokens(kWindows * L, dv, dk, ++seed);
          std::vector<State> states;
          std::vector<std::vector<double>> reference;
          conventional(kind, tokens, dv, dk, states, reference);
          const ReplayRun run = replay(kind, tokens, dv, dk, L, true, lp);
          // The high-precision copy carries the exact recurrence, whatever the read format.
          REQUIRE(run.hp_checkpoints.size() == kWindows);
          for (int w = 0; w < kWindows; ++w) {
            const State& exact = states[static_cast<std::size_t>((w + 1) * L - 1)];
            for (std::size_t i = 0; i < exact.a.size(); ++i)
              REQUIRE(run.hp_checkpoints[w].a[i] == doctest::Approx(exact.a[i]).epsilon(1e-9).scale(max_abs(exact.a)));
          }
          const Traffic w = split_window_traffic(state_bytes(dv, dk, StorageFormat::fp32), state_bytes(dv, dk, lp),
                                                 record_bytes(kind, true, dv, dk), L);
          CHECK(run.memory.state_read == kWindows * w.state_read);
          CHECK(run.memory.state_write == kWindows * w.state_write);
          CHECK(run.memory.record_read == kWindows * w.record_read);
          CHECK(run.memory.record_write == kWindows * w.record_write);
        }
      }
    }
  }
}
