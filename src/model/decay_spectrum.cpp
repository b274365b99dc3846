#include "model/decay_spectrum.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>

#include <fmt/format.h>

namespace replayssm::model {

// ---- DecayHistogram ------------------------------------------------------------------------------

namespace {
// x on the logit axis: log10(x) - log10(1 - x), with 1 - x exact for x >= 0.5 (Sterbenz).
double logit10(double x) { return std::log10(x) - std::log10(1.0 - x); }
double from_logit10(double t) { return 1.0 / (1.0 + std::pow(10.0, -t)); }
}  // namespace

void DecayHistogram::add(double x) {
  if (!(x >= 0.0 && x <= 1.0))
    throw std::invalid_argument(fmt::format("decay {} is outside [0, 1]", x));
  int bin = 0;
  if (x == 1.0) {
    bin = kBins - 1;
  } else if (x > 0.0) {
    const double t = logit10(x);
    bin = std::clamp(static_cast<int>(std::floor((t + kDecades) * kBinsPerDecade)) + 1, 0, kBins - 1);
  }
  ++counts_[static_cast<std::size_t>(bin)];
  ++total_;
}

std::pair<double, double> DecayHistogram::bin_edges(int i) {
  if (i < 0 || i >= kBins) throw std::out_of_range(fmt::format("histogram bin {} outside [0, {})", i, kBins));
  const auto edge = [](int k) { return from_logit10(-kDecades + static_cast<double>(k) / kBinsPerDecade); };
  if (i == 0) return {0.0, edge(0)};
  if (i == kBins - 1) return {edge(kBins - 2), 1.0};
  return {edge(i - 1), edge(i)};
}

double DecayHistogram::quantile(double q) const {
  if (!(q >= 0.0 && q <= 1.0)) throw std::invalid_argument(fmt::format("quantile {} outside [0, 1]", q));
  if (total_ == 0) return std::numeric_limits<double>::quiet_NaN();
  // The first bin whose cumulative count reaches q * total (at least one value).
  const double target = std::max(1.0, std::ceil(q * static_cast<double>(total_)));
  uint64_t cum = 0;
  int i = 0;
  for (; i < kBins - 1; ++i) {
    cum += counts_[static_cast<std::size_t>(i)];
    if (static_cast<double>(cum) >= target) break;
  }
  if (i == 0) return 0.0;
  if (i == kBins - 1) return 1.0;
  return from_logit10(-kDecades + (i - 0.5) / kBinsPerDecade);
}

void DecayHistogram::merge(const DecayHistogram& other) {
  for (int i = 0; i < kBins; ++i) counts_[static_cast<std::size_t>(i)] += other.counts_[static_cast<std::size_t>(i)];
  total_ += other.total_;
}

// ---- HeadDecaySpectrum ---------------------------------------------------------------------------

double HeadDecaySpectrum::mean_alpha() const {
  const double n = static_cast<double>(tokens) * channels;
  return n > 0 ? alpha_sum / n : std::numeric_limits<double>::quiet_NaN();
}

namespace {
double memory_of(double mean) { return mean >= 1.0 ? std::numeric_limits<double>::infinity() : 1.0 / (1.0 - mean); }
}  // namespace

double HeadDecaySpectrum::memory() const { return memory_of(mean_alpha()); }

double HeadDecaySpectrum::max_channel_memory() const {
  double best = 0.0;
  for (const double s : channel_sum) best = std::max(best, memory_of(s / static_cast<double>(tokens)));
  return best;
}

double HeadDecaySpectrum::mean_gamma(std::size_t w) const {
  return gamma_count.at(w) > 0 ? gamma_sum.at(w) / static_cast<double>(gamma_count[w])
                               : std::numeric_limits<double>::quiet_NaN();
}

// ---- DecaySpectrumCollector ----------------------------------------------------------------------

DecaySpectrumCollector::DecaySpectrumCollector(std::vector<int> windows) : windows_(std::move(windows)) {
  for (const int L : windows_)
    if (L < 1) throw std::invalid_argument(fmt::format("decay spectrum: window L = {} must be positive", L));
}

void DecaySpectrumCollector::observe(const ssm::HeadGroupSequence& seq, ssm::HeadGroupId id) {
  const int channels = seq.kind == ssm::Recurrence::kda ? seq.dk : 1;
  const int64_t n = seq.n_tokens;
  if (seq.alpha.size() != static_cast<std::size_t>(seq.n_value_heads))
    throw std::invalid_argument(fmt::format("decay spectrum: layer {} key head {}: {} decay arrays for {} value heads",
                                            id.layer, id.key_head, seq.alpha.size(), seq.n_value_heads));
  // Each value head's statistics are computed without the lock, then merged under it.
  for (int j = 0; j < seq.n_value_heads; ++j) {
    HeadDecaySpectrum h;
    h.layer = static_cast<int>(id.layer);
    h.key_head = static_cast<int>(id.key_head);
    h.value_head = static_cast<int>(id.key_head) * seq.n_value_heads + j;
    h.kind = seq.kind;
    h.channels = channels;
    h.tokens = static_cast<uint64_t>(n);
    h.channel_sum.assign(static_cast<std::size_t>(channels), 0.0);
    h.windows = windows_;
    h.gamma.resize(windows_.size());
    h.gamma_sum.assign(windows_.size(), 0.0);
    h.gamma_count.assign(windows_.size(), 0);
    const float* a = seq.alpha[static_cast<std::size_t>(j)];
    for (int64_t t = 0; t < n; ++t)
      for (int c = 0; c < channels; ++c) {
        const double x = a[t * channels + c];
        try {
          h.alpha.add(x);
        } catch (const std::invalid_argument&) {
          throw std::invalid_argument(fmt::format("decay spectrum: layer {} value head {}: decay {} at token {}{} is "
                                                  "outside [0, 1]",
                                                  id.layer, h.value_head, x, t,
                                                  channels > 1 ? fmt::format(" channel {}", c) : std::string()));
        }
        h.alpha_sum += x;
        h.channel_sum[static_cast<std::size_t>(c)] += x;
        h.alpha_min = std::min(h.alpha_min, x);
        h.alpha_max = std::max(h.alpha_max, x);
      }
    // gamma over each whole window [w L, (w + 1) L), per channel, as exp of the summed logs (log 0 =
    // -inf gives gamma 0, as the product does).
    for (std::size_t wi = 0; wi < windows_.size(); ++wi) {
      const int64_t L = windows_[wi];
      for (int64_t w0 = 0; w0 + L <= n; w0 += L)
        for (int c = 0; c < channels; ++c) {
          double log_gamma = 0.0;
          for (int64_t t = w0; t < w0 + L; ++t) log_gamma += std::log(static_cast<double>(a[t * channels + c]));
          const double g = std::exp(log_gamma);
          h.gamma[wi].add(g);
          h.gamma_sum[wi] += g;
          ++h.gamma_count[wi];
        }
    }
    const std::lock_guard<std::mutex> lock(mutex_);
    auto [it, fresh] = heads_.try_emplace({h.layer, h.value_head}, h);
    if (fresh) continue;
    HeadDecaySpectrum& acc = it->second;
    if (acc.kind != h.kind || acc.channels != h.channels)
      throw std::invalid_argument(fmt::format("decay spectrum: layer {} value head {} seen with two shapes", h.layer,
                                              h.value_head));
    acc.tokens += h.tokens;
    acc.alpha_sum += h.alpha_sum;
    acc.alpha_min = std::min(acc.alpha_min, h.alpha_min);
    acc.alpha_max = std::max(acc.alpha_max, h.alpha_max);
    for (int c = 0; c < channels; ++c) acc.channel_sum[static_cast<std::size_t>(c)] += h.channel_sum[static_cast<std::size_t>(c)];
    acc.alpha.merge(h.alpha);
    for (std::size_t wi = 0; wi < windows_.size(); ++wi) {
      acc.gamma[wi].merge(h.gamma[wi]);
      acc.gamma_sum[wi] += h.gamma_sum[wi];
      acc.gamma_count[wi] += h.gamma_count[wi];
    }
  }
}

SequenceObserver DecaySpectrumCollector::observer() {
  return [this](const ssm::HeadGroupSequence& seq, ssm::HeadGroupId id) { observe(seq, id); };
}

std::vector<HeadDecaySpectrum> DecaySpectrumCollector::heads() const {
  const std::lock_guard<std::mutex> lock(mutex_);
  std::vector<HeadDecaySpectrum> out;
  out.reserve(heads_.size());
  for (const auto& [key, h] : heads_) out.push_back(h);
  return out;
}

// ---- summary and report --------------------------------------------------------------------------

DecaySummary summarize_decays(const std::vector<HeadDecaySpectrum>& heads, double long_memory_tokens) {
  DecaySummary s;
  s.long_memory_tokens = long_memory_tokens;
  s.heads_per_decade.assign(7, 0);
  s.heads = heads.size();
  std::vector<double> mem;
  for (const auto& h : heads) {
    const double m = h.memory();
    mem.push_back(m);
    const int decade = std::clamp(static_cast<int>(std::floor(std::log10(std::max(m, 1.0)))), 0, 6);
    ++s.heads_per_decade[static_cast<std::size_t>(decade)];
    if (m >= long_memory_tokens) ++s.long_memory_heads;
  }
  if (!mem.empty()) {
    std::sort(mem.begin(), mem.end());
    const std::size_t k = mem.size();
    s.median_memory = k % 2 ? mem[k / 2] : 0.5 * (mem[k / 2 - 1] + mem[k / 2]);
    s.max_memory = mem.back();
  }
  return s;
}

namespace {
std::string tokens_text(double m) { return std::isinf(m) ? std::string("inf") : fmt::format("{:.1f}", m); }
}  // namespace

std::string format_decay_report(const std::vector<HeadDecaySpectrum>& heads, const DecaySummary& summary) {
  std::string out;
  if (heads.empty()) return "no SSM layers: the model has no recurrent state\n";
  const bool kda = std::any_of(heads.begin(), heads.end(), [](const auto& h) { return h.channels > 1; });
  out += fmt::format("{:>5} {:>5} {:>6} {:>10} {:>17} {:>10} {:>10} {:>10}", "layer", "head", "kind", "mean alpha",
                     "memory 1/(1-mean)", "alpha p10", "alpha p50", "alpha p90");
  for (const int L : heads.front().windows) out += fmt::format(" {:>12}", fmt::format("mean gamma{}", L));
  if (kda) out += fmt::format(" {:>14}", "max channel mem");
  out += "\n";
  for (const auto& h : heads) {
    out += fmt::format("{:>5} {:>5} {:>6} {:>10.6f} {:>17} {:>10.6f} {:>10.6f} {:>10.6f}", h.layer, h.value_head,
                       ssm::to_string(h.kind), h.mean_alpha(), tokens_text(h.memory()), h.alpha.quantile(0.1),
                       h.alpha.quantile(0.5), h.alpha.quantile(0.9));
    for (std::size_t w = 0; w < h.windows.size(); ++w) out += fmt::format(" {:>12.4e}", h.mean_gamma(w));
    if (kda) out += fmt::format(" {:>14}", tokens_text(h.max_channel_memory()));
    out += "\n";
  }
  out += fmt::format(
      "alpha quantiles from histograms over log10(alpha / (1 - alpha)), {} bins per decade (12% resolution in 1 - "
      "alpha near 1, in alpha near 0; 0 and 1 stand for beyond 1e-8 of either end)\n",
      DecayHistogram::kBinsPerDecade);
  out += fmt::format("effective memory 1/(1 - mean alpha) of the {} heads (tokens): median {}, largest {}\n",
                     summary.heads, tokens_text(summary.median_memory), tokens_text(summary.max_memory));
  static const char* kDecadeNames[] = {"[1, 10)", "[10, 100)", "[100, 1K)", "[1K, 10K)", "[10K, 100K)", "[100K, 1M)",
                                       ">= 1M"};
  out += "  heads per decade:";
  for (std::size_t d = 0; d < summary.heads_per_decade.size(); ++d)
    out += fmt::format(" {} {}{}", kDecadeNames[d], summary.heads_per_decade[d], d + 1 < 7 ? "," : "");
  out += "\n";
  out += fmt::format("  heads with memory >= {:.0f} tokens: {} of {} ({:.1f}%)\n", summary.long_memory_tokens,
                     summary.long_memory_heads, summary.heads,
                     summary.heads ? 100.0 * static_cast<double>(summary.long_memory_heads) / summary.heads : 0.0);
  return out;
}

nlohmann::json decay_report_json(const std::vector<HeadDecaySpectrum>& heads, const DecaySummary& summary) {
  nlohmann::json edges = nlohmann::json::array();
  for (int i = 0; i < DecayHistogram::kBins; ++i) {
    const auto [lo, hi] = DecayHistogram::bin_edges(i);
    edges.push_back({lo, hi});
  }
  const auto finite_or_null = [](double v) { return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr); };
  nlohmann::json jh = nlohmann::json::array();
  for (const auto& h : heads) {
    nlohmann::json g = nlohmann::json::array();
    for (std::size_t w = 0; w < h.windows.size(); ++w)
      g.push_back({{"L", h.windows[w]},
                   {"mean", finite_or_null(h.mean_gamma(w))},
                   {"windows_counted", h.gamma_count[w]},
                   {"histogram", h.gamma[w].counts()}});
    jh.push_back({{"layer", h.layer},
                  {"value_head", h.value_head},
                  {"key_head", h.key_head},
                  {"recurrence", std::string(ssm::to_string(h.kind))},
                  {"channels", h.channels},
                  {"tokens", h.tokens},
                  {"mean_alpha", h.mean_alpha()},
                  {"min_alpha", h.alpha_min},
                  {"max_alpha", h.alpha_max},
                  {"memory_tokens", finite_or_null(h.memory())},
                  {"max_channel_memory_tokens", finite_or_null(h.max_channel_memory())},
                  {"alpha_quantiles", {{"p10", h.alpha.quantile(0.1)}, {"p50", h.alpha.quantile(0.5)},
                                       {"p90", h.alpha.quantile(0.9)}}},
                  {"alpha_histogram", h.alpha.counts()},
                  {"gamma", g}});
  }
  return {{"histogram",
           {{"axis", "alpha (and gamma): bins over log10(x / (1 - x)); first bin below, last above the range"},
            {"bins_per_decade", DecayHistogram::kBinsPerDecade},
            {"decades", DecayHistogram::kDecades},
            {"bin_edges", edges}}},
          {"summary",
           {{"heads", summary.heads},
            {"median_memory_tokens", finite_or_null(summary.median_memory)},
            {"max_memory_tokens", finite_or_null(summary.max_memory)},
            {"long_memory_tokens", summary.long_memory_tokens},
            {"long_memory_heads", summary.long_memory_heads},
            {"heads_per_decade", summary.heads_per_decade},
            {"decades", {"[1,10)", "[10,100)", "[100,1K)", "[1K,10K)", "[10K,100K)", "[100K,1M)", ">=1M"}}}},
          {"heads", jh}};
}

}  // namespace replayssm::model
