// The decay spectrum of `replayssm info --decays` (model/decay_spectrum.h): its statistics against
// float64 computations on fresh random decays, and the decays the model shows it against an
// independent float64 evaluation of Mamba-2's alpha = exp(dt A) from the golden checkpoint's tensors.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "model/causal_lm.h"
#include "model/decay_spectrum.h"
#include "model/safetensors.h"
#include "test_util.h"

using replayssm::model::DecayHistogram;
using replayssm::model::DecaySpectrumCollector;
using replayssm::model::HeadDecaySpectrum;
using replayssm::test::kBaseSeed;

namespace {

double logit10(double x) { return std::log10(x) - std::log10(1.0 - x); }

// Decays spread over many decades towards both ends: 1 - 10^-u or 10^-u, u uniform in [0, 7].
std::vector<float> random_decays(std::mt19937_64& g, std::size_t n) {
  std::uniform_real_distribution<double> u(0.0, 7.0);
  std::bernoulli_distribution near_one(0.7);
  std::vector<float> a(n);
  for (auto& x : a) {
    const double e = std::pow(10.0, -u(g));
    x = static_cast<float>(near_one(g) ? 1.0 - e : e);
  }
  return a;
}

}  // namespace

TEST_CASE("DecayHistogram: quantiles within one bin of the exact ones, end bins, refusals") {
  std::mt19937_64 g(kBaseSeed + 901);
  for (const std::size_t n : {1u, 7u, 1000u, 20001u}) {
    CAPTURE(n);
    const std::vector<float> a = random_decays(g, n);
    DecayHistogram h;
    for (const float x : a) h.add(x);
    CHECK(h.total() == n);
    std::vector<double> sorted(a.begin(), a.end());
    std::sort(sorted.begin(), sorted.end());
    for (const double q : {0.0, 0.1, 0.5, 0.9, 0.99, 1.0}) {
      CAPTURE(q);
      // The exact q-quantile as the histogram defines it: the ceil(q n)-th smallest (at least the 1st).
      const std::size_t k = std::max<std::size_t>(1, static_cast<std::size_t>(std::ceil(q * static_cast<double>(n))));
      const double exact = sorted[k - 1];
      const double got = h.quantile(q);
      if (exact == 0.0 || exact == 1.0 || std::abs(logit10(exact)) >= DecayHistogram::kDecades) continue;
      CHECK(std::abs(logit10(got) - logit10(exact)) <= 1.0 / DecayHistogram::kBinsPerDecade + 1e-12);
    }
  }
  DecayHistogram ends;
  ends.add(0.0);
  ends.add(1.0);
  ends.add(1.0);
  CHECK(ends.counts().front() == 1);
  CHECK(ends.counts().back() == 2);
  CHECK(ends.quantile(0.0) == 0.0);
  CHECK(ends.quantile(1.0) == 1.0);
  // Bin edges tile [0, 1] in order.
  double prev = 0.0;
  for (int i = 0; i < DecayHistogram::kBins; ++i) {
    const auto [lo, hi] = DecayHistogram::bin_edges(i);
    CHECK(lo == doctest::Approx(prev).epsilon(1e-12));
    CHECK(hi > lo);
    prev = hi;
  }
  CHECK(prev == 1.0);
  DecayHistogram bad;
  CHECK(replayssm::test::contains(replayssm::test::error_of([&] { bad.add(1.5); }), "outside [0, 1]"));
  CHECK(replayssm::test::contains(replayssm::test::error_of([&] { bad.add(-0.1); }), "outside [0, 1]"));
  CHECK(replayssm::test::contains(replayssm::test::error_of([&] { bad.add(std::nan("")); }), "outside [0, 1]"));
  CHECK(std::isnan(DecayHistogram().quantile(0.5)));
}

TEST_CASE("DecaySpectrumCollector: means, memory and gamma over windows against float64, over two texts") {
  std::mt19937_64 g(kBaseSeed + 902);
  for (const auto kind : {replayssm::ssm::Recurrence::mamba2, replayssm::ssm::Recurrence::kda}) {
    CAPTURE(static_cast<int>(kind));
    const int dk = 5, heads = 3, channels = kind == replayssm::ssm::Recurrence::kda ? dk : 1;
    const std::vector<int> windows{4, 7};
    const std::vector<int> lengths{37, 22};  // neither a multiple of either window
    DecaySpectrumCollector collector(windows);
    const replayssm::model::SequenceObserver observe = collector.observer();
    // texts[b][j]: value head j's decays in text b (tokens x channels).
    std::vector<std::vector<std::vector<float>>> texts;
    for (const int n : lengths) {
      std::vector<std::vector<float>> per_head;
      replayssm::ssm::HeadGroupSequence seq;
      seq.kind = kind;
      seq.n_tokens = n;
      seq.dk = dk;
      seq.dv = 2;
      seq.n_value_heads = heads;
      for (int j = 0; j < heads; ++j) per_head.push_back(random_decays(g, static_cast<std::size_t>(n) * channels));
      for (const auto& a : per_head) seq.alpha.push_back(a.data());
      observe(seq, replayssm::ssm::HeadGroupId{6, 2});
      texts.push_back(std::move(per_head));
    }
    const std::vector<HeadDecaySpectrum> got = collector.heads();
    REQUIRE(got.size() == static_cast<std::size_t>(heads));
    for (int j = 0; j < heads; ++j) {
      CAPTURE(j);
      const HeadDecaySpectrum& h = got[static_cast<std::size_t>(j)];
      CHECK(h.layer == 6);
      CHECK(h.key_head == 2);
      CHECK(h.value_head == 2 * heads + j);
      CHECK(h.channels == channels);
      CHECK(h.tokens == static_cast<uint64_t>(lengths[0] + lengths[1]));
      double sum = 0.0, count = 0.0;
      std::vector<double> channel_sum(static_cast<std::size_t>(channels), 0.0);
      for (std::size_t b = 0; b < texts.size(); ++b)
        for (int t = 0; t < lengths[b]; ++t)
          for (int c = 0; c < channels; ++c) {
            const double x = texts[b][static_cast<std::size_t>(j)][static_cast<std::size_t>(t * channels + c)];
            sum += x;
            count += 1;
            channel_sum[static_cast<std::size_t>(c)] += x;
          }
      CHECK(h.mean_alpha() == doctest::Approx(sum / count).epsilon(1e-12));
      CHECK(h.memory() == doctest::Approx(1.0 / (1.0 - sum / count)).epsilon(1e-9));
      double best = 0.0;
      for (const double s : channel_sum) best = std::max(best, 1.0 / (1.0 - s / static_cast<double>(h.tokens)));
      CHECK(h.max_channel_memory() == doctest::Approx(best).epsilon(1e-9));
      for (std::size_t w = 0; w < windows.size(); ++w) {
        CAPTURE(windows[w]);
        // Windows restart with every text; a partial last window is not counted.
        double gsum = 0.0;
        uint64_t gcount = 0;
        for (std::size_t b = 0; b < texts.size(); ++b)
          for (int w0 = 0; w0 + windows[w] <= lengths[b]; w0 += windows[w])
            for (int c = 0; c < channels; ++c) {
              double prod = 1.0;
              for (int t = w0; t < w0 + windows[w]; ++t)
                prod *= texts[b][static_cast<std::size_t>(j)][static_cast<std::size_t>(t * channels + c)];
              gsum += prod;
              ++gcount;
            }
        CHECK(h.gamma_count[w] == gcount);
        CHECK(h.mean_gamma(w) == doctest::Approx(gsum / static_cast<double>(gcount)).epsilon(1e-9));
        // Appendix F's skip counts: gamma_h (float64 here; its largest channel) under each format's
        // unit roundoff, non-flush steps and flushes of the whole windows apart. These decays keep
        // every product far (relatively) from a threshold, so float32 and float64 decide alike.
        std::vector<uint64_t> steps_skipped(replayssm::model::kSkipFormats.size(), 0),
            flushes_skipped(replayssm::model::kSkipFormats.size(), 0);
        uint64_t steps = 0, flushes = 0;
        for (std::size_t b = 0; b < texts.size(); ++b)
          for (int w0 = 0; w0 + windows[w] <= lengths[b]; w0 += windows[w]) {
            std::vector<double> prod(static_cast<std::size_t>(channels), 1.0);
            for (int t = w0; t < w0 + windows[w]; ++t) {
              double largest = 0.0;
              for (int c = 0; c < channels; ++c) {
                prod[static_cast<std::size_t>(c)] *=
                    texts[b][static_cast<std::size_t>(j)][static_cast<std::size_t>(t * channels + c)];
                largest = std::max(largest, prod[static_cast<std::size_t>(c)]);
              }
              const bool flush = t == w0 + windows[w] - 1;
              ++(flush ? flushes : steps);
              for (std::size_t f = 0; f < replayssm::model::kSkipFormats.size(); ++f)
                (flush ? flushes_skipped : steps_skipped)[f] +=
                    largest < replayssm::formats::unit_roundoff(replayssm::model::kSkipFormats[f]);
            }
          }
        CHECK(h.skip_steps_counted[w] == steps);
        CHECK(h.skip_flushes_counted[w] == flushes);
        for (std::size_t f = 0; f < replayssm::model::kSkipFormats.size(); ++f) {
          CHECK(h.skip_steps[w][f] == steps_skipped[f]);
          CHECK(h.skip_flushes[w][f] == flushes_skipped[f]);
        }
      }
    }
    const auto summary = replayssm::model::summarize_decays(got, 10.0);
    CHECK(summary.heads == static_cast<std::size_t>(heads));
    uint64_t in_decades = 0;
    for (const auto c : summary.heads_per_decade) in_decades += c;
    CHECK(in_decades == static_cast<uint64_t>(heads));
    std::size_t long_heads = 0;
    for (const auto& h : got) long_heads += h.memory() >= 10.0 ? 1 : 0;
    CHECK(summary.long_memory_heads == long_heads);
  }
  CHECK(replayssm::test::contains(replayssm::test::error_of([] { DecaySpectrumCollector c({16, 0}); }),
                                  "window L = 0"));
}

TEST_CASE("the model shows the observer Mamba-2's alpha = exp(dt A) of every head, as float64 computes it") {
  // Golden Mamba-2 checkpoint; layer 0's input is the embedding, so its decays follow from the
  // tensors alone: dt = clamp(softplus(in_proj_dt . rmsnorm(e) + dt_bias), time_step_limit),
  // alpha = exp(-exp(A_log) dt) (transformers Mamba2Mixer), evaluated here in float64.
  const std::string dir = replayssm::test::source_path("data/models/mamba2_tiny");
  const auto lm = replayssm::model::CausalLM::load(dir);
  const auto& cfg = lm.config();
  std::mt19937_64 g(kBaseSeed + 903);
  std::uniform_int_distribution<int64_t> tok(0, cfg.vocab_size - 1);
  std::vector<int64_t> tokens(53);
  for (auto& t : tokens) t = tok(g);
  DecaySpectrumCollector collector({16});
  std::vector<std::vector<float>> layer0(8);  // per value head, captured from the observer
  const replayssm::model::SequenceObserver observe = [&](const replayssm::ssm::HeadGroupSequence& seq,
                                                         replayssm::ssm::HeadGroupId id) {
    collector.observe(seq, id);
    if (id.layer != 0) return;
    for (int j = 0; j < seq.n_value_heads; ++j) {
      const int h = static_cast<int>(id.key_head) * seq.n_value_heads + j;
      layer0.at(static_cast<std::size_t>(h)).assign(seq.alpha[static_cast<std::size_t>(j)],
                                                    seq.alpha[static_cast<std::size_t>(j)] + seq.n_tokens);
    }
  };
  lm.final_hidden(tokens, replayssm::model::PolicyAssignment(replayssm::ssm::PrecisionPolicy::parse("conv:fp32")), 2, {},
                  &observe);
  const auto heads = collector.heads();
  CHECK(heads.size() == 3 * 8);  // 3 Mamba-2 layers x 8 heads
  for (const auto& h : heads) CHECK(h.tokens == tokens.size());

  replayssm::model::SafetensorsFile st(dir + "/model.safetensors");
  const auto read = [&](const std::string& name) { return st.read_float32(*st.find(name)); };
  const std::vector<float> embed = read("backbone.embeddings.weight"), norm = read("backbone.layers.0.norm.weight"),
                           in_proj = read("backbone.layers.0.mixer.in_proj.weight"),
                           dt_bias = read("backbone.layers.0.mixer.dt_bias"), a_log = read("backbone.layers.0.mixer.A_log");
  const int d = 64, heads0 = 8, rows = static_cast<int>(in_proj.size()) / d, dt0 = rows - heads0;
  const double eps = 1e-5, dt_min = 0.004, dt_max = 0.5;  // config.json: layer_norm_epsilon, time_step_limit
  double worst = 0.0;
  for (std::size_t t = 0; t < tokens.size(); ++t) {
    const float* e = embed.data() + tokens[t] * d;
    double ms = 0.0;
    for (int i = 0; i < d; ++i) ms += double(e[i]) * e[i];
    const double r = 1.0 / std::sqrt(ms / d + eps);
    for (int h = 0; h < heads0; ++h) {
      double dt = dt_bias[static_cast<std::size_t>(h)];
      for (int i = 0; i < d; ++i) dt += double(in_proj[static_cast<std::size_t>((dt0 + h) * d + i)]) * (e[i] * r * norm[i]);
      dt = dt > 20 ? dt : std::log1p(std::exp(dt));
      dt = std::clamp(dt, dt_min, dt_max);
      const double alpha = std::exp(-std::exp(double(a_log[static_cast<std::size_t>(h)])) * dt);
      const double got = layer0[static_cast<std::size_t>(h)].at(t);
      worst = std::max(worst, std::abs(got - alpha) / alpha);
    }
  }
  MESSAGE("layer 0 alpha against float64: largest relative difference " << worst);
  CHECK(worst < 2e-5);  // FP32 products and exp against float64
}
