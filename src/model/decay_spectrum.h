// How long each SSM head of a model remembers on real text (issue 11; REPLAYSSM.md section 6):
// `replayssm info MODEL --decays --text-dir DIR`. Per value head of every SSM layer, over every
// token of the texts run through the model (observed through layers.h SequenceObserver):
//   alpha_t   the decay of the state at token t (Mamba-2 exp(dt A), GDN exp(g): one per token; KDA: one
//             per token and key channel);
//   gamma_L   the decay over a window of L tokens, prod alpha_t over the windows [0, L), [L, 2L), ...
//             of each text (the flush windows; a last partial window is not counted): section 6's
//             shared-checkpoint error b/(1 - alpha^L) has 1 - gamma_L in place of 1 - alpha^L;
//   memory    the effective memory 1/(1 - mean alpha) in tokens (section 6: conventional decode's error
//             b/(1 - alpha)); KDA also per channel, the largest reported.
// Distributions are kept as histograms on the logit axis log10(x / (1 - x)) (DecayHistogram), so
// that values near 1 (long memory) and near 0 (a head that resets) are both resolved and memory
// stays bounded whatever the text length; means are exact (double sums).
#pragma once
#include <array>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "formats/quantized_matrix.h"
#include "model/layers.h"
#include "ssm/sequence_emulator.h"
#include "ssm/ssm_types.h"

namespace replayssm::model {

// Counts of values x in [0, 1] on the logit axis t = log10(x / (1 - x)): bins of 1/kBinsPerDecade
// from t = -kDecades to +kDecades, so both ends are resolved (to 12% in 1 - x near 1, in x near 0);
// bin 0 holds t < -kDecades (x = 0 included), the last bin t >= kDecades (x = 1 included). Values
// outside [0, 1] and NaN throw std::invalid_argument (a decay outside [0, 1] is a model error this
// tool must not average away).
class DecayHistogram {
 public:
  static constexpr int kBinsPerDecade = 20, kDecades = 8, kBins = 2 * kDecades * kBinsPerDecade + 2;
  void add(double x);
  uint64_t total() const { return total_; }
  const std::array<uint64_t, kBins>& counts() const { return counts_; }
  // The q-quantile (q in [0, 1]): the x at the middle (on the logit axis) of the bin where the
  // cumulative count reaches q; 0 or 1 for the two end bins; NaN when empty.
  double quantile(double q) const;
  // Lower and upper edge of bin i in x.
  static std::pair<double, double> bin_edges(int i);
  void merge(const DecayHistogram& other);

 private:
  std::array<uint64_t, kBins> counts_{};
  uint64_t total_ = 0;
};

// The formats whose unit roundoff is a ',skip=auto' threshold the report counts against
// (appendix F; precision_policy.h CheckpointSkip).
inline constexpr std::array<formats::StorageFormat, 4> kSkipFormats = {
    formats::StorageFormat::fp32, formats::StorageFormat::fp16, formats::StorageFormat::fp8b128,
    formats::StorageFormat::nvfp4};

struct HeadDecaySpectrum {
  int layer = 0, value_head = 0, key_head = 0;
  ssm::Recurrence kind = ssm::Recurrence::mamba2;
  int channels = 1;                 // decays per token: 1, or dk for KDA
  uint64_t tokens = 0;              // tokens observed (over every text)
  double alpha_sum = 0.0;           // over tokens x channels
  double alpha_min = 1.0, alpha_max = 0.0;
  std::vector<double> channel_sum;  // per channel, over tokens (size channels)
  DecayHistogram alpha;
  std::vector<int> windows;         // L of each gamma entry
  std::vector<DecayHistogram> gamma;
  std::vector<double> gamma_sum;
  std::vector<uint64_t> gamma_count;  // windows x channels counted
  // Appendix F, per window L: of the non-flush steps (h = 1..L-1) and flushes (h = L) of the whole
  // windows, how many have gamma_h (the float32 running product from the window's start, as the
  // emulator computes it; KDA: the largest channel) below the unit roundoff of kSkipFormats[f]:
  // the steps ',skip=auto' skips when that format is the copy read.
  std::vector<uint64_t> skip_steps_counted, skip_flushes_counted;
  std::vector<std::array<uint64_t, kSkipFormats.size()>> skip_steps, skip_flushes;

  double mean_alpha() const;
  // 1/(1 - mean alpha) tokens; +inf when mean alpha == 1.
  double memory() const;
  // KDA: the largest per-channel 1/(1 - mean alpha_c); equals memory() for one channel.
  double max_channel_memory() const;
  double mean_gamma(std::size_t w) const;
  // Fractions of window w's non-flush steps / flushes that skip a read of kSkipFormats[f] (NaN: none counted).
  double skip_step_fraction(std::size_t w, std::size_t f) const;
  double skip_flush_fraction(std::size_t w, std::size_t f) const;
};

// Collects the spectrum of every head group it is shown (thread-safe: the mixers call it from
// their worker threads). Windows: positive L values for gamma (std::invalid_argument otherwise).
class DecaySpectrumCollector {
 public:
  explicit DecaySpectrumCollector(std::vector<int> windows);
  void observe(const ssm::HeadGroupSequence& seq, ssm::HeadGroupId id);
  // An observer bound to this collector, for CausalLM::final_hidden (valid while this lives).
  SequenceObserver observer();
  // Every head seen, ordered by layer then value head.
  std::vector<HeadDecaySpectrum> heads() const;

 private:
  std::vector<int> windows_;
  mutable std::mutex mutex_;
  std::map<std::pair<int, int>, HeadDecaySpectrum> heads_;  // (layer, value head)
};

// The summary across heads: how many heads have an effective memory in each decade [1, 10),
// [10, 100), ..., [10^6, inf), the median and largest memory, and the heads at or above
// long_memory_tokens (issue 11: 1,000 tokens, where state errors accumulate over 128K).
struct DecaySummary {
  std::vector<uint64_t> heads_per_decade;  // 7 decades from 10^0 to >= 10^6
  std::size_t heads = 0, long_memory_heads = 0;
  double long_memory_tokens = 1000.0;
  double median_memory = 0.0, max_memory = 0.0;
};
DecaySummary summarize_decays(const std::vector<HeadDecaySpectrum>& heads, double long_memory_tokens = 1000.0);

// The report `replayssm info --decays` prints: one line per head (layer, value head, recurrence,
// mean alpha, memory, alpha's 10/50/90% quantiles, mean gamma per window, KDA's largest channel
// memory), the summary, and appendix F's skip fractions by head class (memory decade) with the
// checkpoint traffic they save on the paper's shapes of the model's recurrence (decays from this
// model, dims from the paper).
std::string format_decay_report(const std::vector<HeadDecaySpectrum>& heads, const DecaySummary& summary);
// The same as JSON (histograms included: bin edges once, counts per head).
nlohmann::json decay_report_json(const std::vector<HeadDecaySpectrum>& heads, const DecaySummary& summary);

}  // namespace replayssm::model
