#include "model/decay_spectrum.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>

#include <fmt/format.h>

#include "ssm/analytic_model.h"
#include "ssm/model_shapes.h"

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

double HeadDecaySpectrum::skip_step_fraction(std::size_t w, std::size_t f) const {
  const uint64_t n = skip_steps_counted.at(w);
  return n > 0 ? static_cast<double>(skip_steps.at(w).at(f)) / static_cast<double>(n)
               : std::numeric_limits<double>::quiet_NaN();
}

double HeadDecaySpectrum::skip_flush_fraction(std::size_t w, std::size_t f) const {
  const uint64_t n = skip_flushes_counted.at(w);
  return n > 0 ? static_cast<double>(skip_flushes.at(w).at(f)) / static_cast<double>(n)
               : std::numeric_limits<double>::quiet_NaN();
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
    h.skip_steps_counted.assign(windows_.size(), 0);
    h.skip_flushes_counted.assign(windows_.size(), 0);
    h.skip_steps.assign(windows_.size(), {});
    h.skip_flushes.assign(windows_.size(), {});
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
      // Appendix F: gamma_h as the emulator forms it (float32 product in token order, largest channel).
      std::vector<float> running(static_cast<std::size_t>(channels));
      std::array<float, kSkipFormats.size()> threshold{};
      for (std::size_t f = 0; f < kSkipFormats.size(); ++f) threshold[f] = formats::unit_roundoff(kSkipFormats[f]);
      for (int64_t w0 = 0; w0 + L <= n; w0 += L) {
        std::fill(running.begin(), running.end(), 1.0f);
        for (int64_t t = w0; t < w0 + L; ++t) {
          float largest = 0.0f;
          for (int c = 0; c < channels; ++c) {
            running[static_cast<std::size_t>(c)] *= a[t * channels + c];
            largest = std::max(largest, running[static_cast<std::size_t>(c)]);
          }
          const bool flush = t == w0 + L - 1;
          auto& counts = flush ? h.skip_flushes[wi] : h.skip_steps[wi];
          ++(flush ? h.skip_flushes_counted : h.skip_steps_counted)[wi];
          for (std::size_t f = 0; f < kSkipFormats.size(); ++f) counts[f] += largest < threshold[f];
        }
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
      acc.skip_steps_counted[wi] += h.skip_steps_counted[wi];
      acc.skip_flushes_counted[wi] += h.skip_flushes_counted[wi];
      for (std::size_t f = 0; f < kSkipFormats.size(); ++f) {
        acc.skip_steps[wi][f] += h.skip_steps[wi][f];
        acc.skip_flushes[wi][f] += h.skip_flushes[wi][f];
      }
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

constexpr const char* kDecadeNames[] = {"[1, 10)", "[10, 100)", "[100, 1K)", "[1K, 10K)", "[10K, 100K)",
                                        "[100K, 1M)", ">= 1M"};

int memory_decade(const HeadDecaySpectrum& h) {
  return std::clamp(static_cast<int>(std::floor(std::log10(std::max(h.memory(), 1.0)))), 0, 6);
}

std::size_t skip_format_index(formats::StorageFormat f) {
  for (std::size_t i = 0; i < kSkipFormats.size(); ++i)
    if (kSkipFormats[i] == f) return i;
  throw std::logic_error("skip_format_index: not a skip format");
}

// One head's checkpoint traffic per window under split:READ+rtn/fp32@L on a paper shape (REPLAYSSM.md
// section 7), with (skip) or without ',skip=auto' at this head's measured fractions, over the
// conventional FP32 window 2 L M_32.
double split_traffic_over_conventional(const HeadDecaySpectrum& h, std::size_t w, const ssm::ModelShape& shape,
                                       formats::StorageFormat read, bool skip) {
  const int L = h.windows[w];
  const double m32 = static_cast<double>(ssm::state_bytes(shape.dv, shape.dk, formats::StorageFormat::fp32));
  const double mlp = static_cast<double>(ssm::state_bytes(shape.dv, shape.dk, read));
  const uint64_t r = ssm::record_bytes(shape.kind, true, shape.dv, shape.dk);
  double bytes = static_cast<double>(
      ssm::split_window_traffic(static_cast<uint64_t>(m32), static_cast<uint64_t>(mlp), r, L).total());
  if (skip)
    bytes -= h.skip_step_fraction(w, skip_format_index(read)) * (L - 1) * mlp +
             h.skip_flush_fraction(w, skip_format_index(formats::StorageFormat::fp32)) * m32;
  return bytes / static_cast<double>(ssm::conventional_window_traffic(static_cast<uint64_t>(m32), L).total());
}

// Appendix F's section of the text report.
std::string format_skip_report(const std::vector<HeadDecaySpectrum>& heads) {
  std::string out;
  const ssm::Recurrence kind = heads.front().kind;
  std::vector<const ssm::ModelShape*> shapes;
  for (const ssm::ModelShape& s : ssm::paper_shapes())
    if (s.kind == kind) shapes.push_back(&s);
  for (std::size_t w = 0; w < heads.front().windows.size(); ++w) {
    const int L = heads.front().windows[w];
    out += fmt::format(
        "checkpoint-read skipping (appendix F, ',skip=auto'), L = {}: by head class (memory 1/(1 - mean alpha)), the "
        "mean fraction of non-flush steps whose gamma_h is below the unit roundoff u of the copy read, and of "
        "flushes below the recur copy's\n",
        L);
    out += fmt::format("  {:<12} {:>5} {:>14} {:>14} {:>15} {:>16} {:>16}\n", "memory", "heads", "steps<u(fp16)",
                       "steps<u(fp8)", "steps<u(nvfp4)", "flushes<u(fp32)", "flushes<u(fp16)");
    for (int d = 0; d < 7; ++d) {
      std::vector<const HeadDecaySpectrum*> in;
      for (const auto& h : heads)
        if (memory_decade(h) == d && h.skip_steps_counted[w] > 0) in.push_back(&h);
      if (in.empty()) continue;
      const auto mean = [&](auto&& f) {
        double sum = 0.0;
        for (const HeadDecaySpectrum* h : in) sum += f(*h);
        return sum / static_cast<double>(in.size());
      };
      const auto steps = [&](formats::StorageFormat f) {
        return mean([&](const HeadDecaySpectrum& h) { return h.skip_step_fraction(w, skip_format_index(f)); });
      };
      const auto flushes = [&](formats::StorageFormat f) {
        return mean([&](const HeadDecaySpectrum& h) { return h.skip_flush_fraction(w, skip_format_index(f)); });
      };
      out += fmt::format("  {:<12} {:>5} {:>14.3f} {:>14.3f} {:>15.3f} {:>16.3f} {:>16.3f}\n", kDecadeNames[d],
                         in.size(), steps(formats::StorageFormat::fp16), steps(formats::StorageFormat::fp8b128),
                         steps(formats::StorageFormat::nvfp4), flushes(formats::StorageFormat::fp32),
                         flushes(formats::StorageFormat::fp16));
      std::string traffic_line;
      for (const ssm::ModelShape* shape : shapes)
        for (formats::StorageFormat read : {formats::StorageFormat::nvfp4, formats::StorageFormat::fp16}) {
          const auto traffic = [&](bool skip) {
            return mean([&](const HeadDecaySpectrum& h) { return split_traffic_over_conventional(h, w, *shape, read, skip); });
          };
          traffic_line += fmt::format("{}{} {} {:.3f} -> {:.3f}", traffic_line.empty() ? "" : "; ", shape->short_name,
                                      formats::to_string(read), traffic(false), traffic(true));
        }
      if (!traffic_line.empty()) out += "    traffic / conventional FP32, without -> with skip: " + traffic_line + "\n";
    }
    if (shapes.empty())
      out += fmt::format("  (no paper shape has the {} recurrence: no traffic figures)\n", ssm::to_string(kind));
    else
      out += fmt::format(
          "  traffic: one head's checkpoint and record bytes per window of split:READ+rtn/fp32@{} on the paper shape "
          "(dims of the shape, decays of this model's heads; REPLAYSSM.md section 7), over conventional FP32 decode's "
          "2 L M_S\n",
          L);
  }
  return out;
}
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
  out += "  heads per decade:";
  for (std::size_t d = 0; d < summary.heads_per_decade.size(); ++d)
    out += fmt::format(" {} {}{}", kDecadeNames[d], summary.heads_per_decade[d], d + 1 < 7 ? "," : "");
  out += "\n";
  out += fmt::format("  heads with memory >= {:.0f} tokens: {} of {} ({:.1f}%)\n", summary.long_memory_tokens,
                     summary.long_memory_heads, summary.heads,
                     summary.heads ? 100.0 * static_cast<double>(summary.long_memory_heads) / summary.heads : 0.0);
  out += format_skip_report(heads);
  return out;
}

namespace {
// Appendix F per head and window: per format, the fractions of non-flush steps and flushes under its u.
nlohmann::json skip_json(const HeadDecaySpectrum& h, std::size_t w) {
  nlohmann::json j = {{"steps_counted", h.skip_steps_counted[w]}, {"flushes_counted", h.skip_flushes_counted[w]}};
  for (std::size_t f = 0; f < kSkipFormats.size(); ++f)
    j[std::string(formats::to_string(kSkipFormats[f]))] = {
        {"unit_roundoff", formats::unit_roundoff(kSkipFormats[f])},
        {"steps_skipped", h.skip_steps[w][f]},
        {"flushes_skipped", h.skip_flushes[w][f]}};
  return j;
}
}  // namespace

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
                   {"histogram", h.gamma[w].counts()},
                   {"skip", skip_json(h, w)}});
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
