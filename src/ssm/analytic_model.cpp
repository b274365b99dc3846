#include "ssm/analytic_model.h"

#include <cmath>
#include <stdexcept>

#include <fmt/format.h>

namespace replayssm::ssm {
namespace {

void require_window(int window) {
  if (window < 1) throw std::invalid_argument(fmt::format("window L must be >= 1 (got {})", window));
}

void require_dims(int dv, int dk) {
  if (dv < 1 || dk < 1) throw std::invalid_argument(fmt::format("head dimensions must be >= 1 (got dv={}, dk={})", dv, dk));
}

void require_alpha(double alpha) {
  if (!(alpha >= 0.0 && alpha < 1.0))
    throw std::invalid_argument(fmt::format("decay alpha must be in [0, 1) (got {})", alpha));
}

constexpr uint64_t kVectorElementBytes = 2;  // bf16 v / u / k in a record
constexpr uint64_t kScalarBytes = 4;         // fp32 alpha (and beta)

}  // namespace

// ---- sizes ----------------------------------------------------------------------------------

uint64_t state_bytes(int dv, int dk, formats::StorageFormat f) {
  require_dims(dv, dk);
  const int block = formats::block_size(f);
  if (dk % block != 0)
    throw std::invalid_argument(fmt::format("{} stores blocks of {} along dk, but dk = {} is not a multiple",
                                            formats::to_string(f), block, dk));
  return formats::storage_bytes(f, static_cast<std::size_t>(dv), static_cast<std::size_t>(dk));
}

uint64_t record_bytes(int dv, int dk) {
  require_dims(dv, dk);
  return kVectorElementBytes * static_cast<uint64_t>(dv + dk) + kScalarBytes;
}

uint64_t split_gdn_record_bytes(int dv, int dk) {
  require_dims(dv, dk);
  return kVectorElementBytes * static_cast<uint64_t>(2 * dv + dk) + 2 * kScalarBytes;
}

uint64_t kda_record_bytes(int dv, int dk) {
  require_dims(dv, dk);
  return kVectorElementBytes * static_cast<uint64_t>(dv + dk) + kScalarBytes * static_cast<uint64_t>(dk);
}

uint64_t split_kda_record_bytes(int dv, int dk) {
  require_dims(dv, dk);
  return kVectorElementBytes * static_cast<uint64_t>(2 * dv + dk) + kScalarBytes * static_cast<uint64_t>(dk + 1);
}

uint64_t record_bytes(Recurrence kind, bool split, int dv, int dk) {
  if (kind == Recurrence::kda) return split ? split_kda_record_bytes(dv, dk) : kda_record_bytes(dv, dk);
  return (kind == Recurrence::gdn && split) ? split_gdn_record_bytes(dv, dk) : record_bytes(dv, dk);
}

uint64_t layer_record_bytes(const ModelShape& shape, bool split, bool share_keys) {
  const uint64_t per_head = record_bytes(shape.kind, split, shape.dv, shape.dk);
  const auto nv = static_cast<uint64_t>(shape.value_heads), nk = static_cast<uint64_t>(shape.key_heads);
  if (!share_keys) return nv * per_head;
  const uint64_t key_bytes = kVectorElementBytes * static_cast<uint64_t>(shape.dk);
  return nv * (per_head - key_bytes) + nk * key_bytes;
}

// ---- traffic per window -----------------------------------------------------------------------

uint64_t replay_record_traffic(uint64_t record_bytes, int window) {
  require_window(window);
  const auto L = static_cast<uint64_t>(window);
  // (L-1)(L+2) is even: L-1 and L+2 differ by 3, so one of them is.
  return (L - 1) * (L + 2) / 2 * record_bytes;
}

Traffic conventional_window_traffic(uint64_t state_bytes, int window) {
  require_window(window);
  const auto L = static_cast<uint64_t>(window);
  return {L * state_bytes, L * state_bytes, 0, 0};
}

Traffic replay_window_traffic(uint64_t state_bytes, uint64_t record_bytes, int window) {
  require_window(window);
  const auto L = static_cast<uint64_t>(window);
  Traffic t;
  t.state_read = L * state_bytes;  // every step reads the checkpoint
  t.state_write = state_bytes;     // the flush writes it once
  t.record_read = L * (L - 1) / 2 * record_bytes;
  t.record_write = (L - 1) * record_bytes;
  return t;
}

Traffic split_window_traffic(uint64_t recur_state_bytes, uint64_t read_state_bytes, uint64_t record_bytes, int window) {
  Traffic t = replay_window_traffic(0, record_bytes, window);
  const auto L = static_cast<uint64_t>(window);
  t.state_read = (L - 1) * read_state_bytes + recur_state_bytes;  // non-flush steps: LP; flush: HP
  t.state_write = recur_state_bytes + read_state_bytes;           // the flush writes both copies
  return t;
}

double replay_nonflush_step_bytes(uint64_t read_state_bytes, uint64_t record_bytes, int window) {
  if (window < 2) throw std::invalid_argument(fmt::format("a window of L = {} has no non-flush step", window));
  const double r = static_cast<double>(record_bytes);
  return static_cast<double>(read_state_bytes) + (window - 2) / 2.0 * r + r;
}

// ---- FLOPs ----------------------------------------------------------------------------------

double conventional_step_flops(int dv, int dk) {
  require_dims(dv, dk);
  return 5.0 * dv * dk - dv;
}

double materialised_step_flops(int dv, int dk, int h) {
  require_dims(dv, dk);
  return 2.0 * (h + 3) * dv * dk;
}

double output_only_step_flops(int dv, int dk, int h) {
  require_dims(dv, dk);
  return 2.0 * dv * dk + 2.0 * (h + 1) * (dv + dk);
}

WindowFlops window_flops(int dv, int dk, int window) {
  require_window(window);
  WindowFlops f;
  f.conventional = window * conventional_step_flops(dv, dk);
  for (int h = 0; h < window; ++h) f.materialised += materialised_step_flops(dv, dk, h);
  for (int h = 0; h + 1 < window; ++h) f.output_only += output_only_step_flops(dv, dk, h);
  f.output_only += materialised_step_flops(dv, dk, window - 1);
  return f;
}

// ---- optimal window -------------------------------------------------------------------------

double per_token_traffic(double window, double state_bytes, double record_bytes, double mean_accepted, double drafts) {
  const double L = window, M = state_bytes, r = record_bytes, a = mean_accepted, T = drafts;
  return M / a + M / L + r * L / (2 * a) - r / 2 + r * T / a - r * T / L;
}

double optimal_window(double state_bytes, double record_bytes, double mean_accepted, double drafts) {
  if (!(state_bytes > 0 && record_bytes > 0))
    throw std::invalid_argument("state and record sizes must be positive");
  if (!(mean_accepted > 0)) throw std::invalid_argument(fmt::format("mean accepted tokens must be > 0 (got {})", mean_accepted));
  const double excess = state_bytes / record_bytes - drafts;
  if (!(excess > 0))
    throw std::invalid_argument(fmt::format("no optimal window: M_S/r = {:.3g} does not exceed T = {}",
                                            state_bytes / record_bytes, drafts));
  return std::sqrt(2.0 * mean_accepted * excess);
}

// ---- speculative verification -------------------------------------------------------------------

std::vector<SchemeTraffic> prior_speculative_schemes(int drafts) {
  if (drafts < 1) throw std::invalid_argument(fmt::format("drafts T must be >= 1 (got {})", drafts));
  const double T = drafts;
  return {
      {"vLLM snapshots", 1, T, "writes the state after every draft token"},
      {"The Mamba in the Llama", 1, 2, "fused replay of accepted tokens then T drafts (serial chain 2T-1)"},
      {"Snakes and Ladders, activation replay", 3, 3, "3 launches: recompute, copy, verify"},
      {"Snakes and Ladders, joint attainment", 3, 4, "padded extra rows"},
      {"STree, algorithm", 2, 1, "masked replay then chunk scan"},
      {"STree, as released", 5, 4, "redundant copies in the released code"},
  };
}

double SpeculativeReplayTraffic::bytes_per_step(uint64_t state_bytes, uint64_t record_bytes) const {
  return (state_reads + state_writes) * static_cast<double>(state_bytes) +
         (record_reads + record_writes) * static_cast<double>(record_bytes);
}

SpeculativeReplayTraffic speculative_replay_traffic(int window, int drafts, double mean_accepted) {
  require_window(window);
  if (drafts < 1) throw std::invalid_argument(fmt::format("drafts T must be >= 1 (got {})", drafts));
  if (drafts > window)
    throw std::invalid_argument(fmt::format(
        "drafts T = {} exceed the window L = {}: the flush test h + T > L would fire on every verify step", drafts, window));
  if (!(mean_accepted >= 1.0 && mean_accepted <= drafts))
    throw std::invalid_argument(
        fmt::format("mean accepted tokens must be in [1, T] = [1, {}] (got {})", drafts, mean_accepted));
  // Deterministic acceptance with the requested mean: a_k = floor((k+1) a) - floor(k a).
  constexpr long long kWarmup = 4096, kSteps = 1 << 20;
  long long h = 0;
  double prev_floor = 0;
  SpeculativeReplayTraffic t;
  for (long long k = 0; k < kWarmup + kSteps; ++k) {
    const double next_floor = std::floor((k + 1) * mean_accepted + 1e-9);
    const auto a = static_cast<long long>(next_floor - prev_floor);
    prev_floor = next_floor;
    const bool counted = k >= kWarmup;
    // Algorithm 2: drafts written at h+1..h+T; checkpoint read; committed records read.
    if (counted) {
      t.state_reads += 1;
      t.record_writes += drafts;
      t.record_reads += static_cast<double>(h);
      t.tokens += static_cast<double>(a);
    }
    if (h + drafts > window) {  // flush the h committed records before the verdict
      if (counted) t.state_writes += 1;
      h = 0;
    }
    h += a;  // after the verdict: commit the accepted prefix (a pointer move)
  }
  t.state_reads /= kSteps;
  t.state_writes /= kSteps;
  t.record_reads /= kSteps;
  t.record_writes /= kSteps;
  t.tokens /= kSteps;
  return t;
}

// ---- crossover ------------------------------------------------------------------------------------

uint64_t layer_state_bytes(const ModelShape& shape, formats::StorageFormat f) {
  return static_cast<uint64_t>(shape.value_heads) * state_bytes(shape.dv, shape.dk, f);
}

uint64_t model_ssm_conventional_step_bytes(const ModelShape& shape, formats::StorageFormat f) {
  return 2 * static_cast<uint64_t>(shape.ssm_layers) * layer_state_bytes(shape, f);
}

double crossover_context_tokens(double ssm_step_bytes, int attention_layers, double kv_bytes_per_token) {
  if (attention_layers < 1)
    throw std::invalid_argument(fmt::format("attention layers must be >= 1 (got {})", attention_layers));
  if (!(kv_bytes_per_token > 0))
    throw std::invalid_argument(fmt::format("KV bytes per token must be > 0 (got {})", kv_bytes_per_token));
  return ssm_step_bytes / (attention_layers * kv_bytes_per_token);
}

// ---- error propagation -------------------------------------------------------------------------

double conventional_error_mean(double b, double alpha, long long n) {
  require_alpha(alpha);
  return b * (1.0 - std::pow(alpha, static_cast<double>(n))) / (1.0 - alpha);
}

double conventional_error_variance(double sigma2, double alpha, long long n) {
  require_alpha(alpha);
  return sigma2 * (1.0 - std::pow(alpha, 2.0 * static_cast<double>(n))) / (1.0 - alpha * alpha);
}

double conventional_error_mean_limit(double b, double alpha) {
  require_alpha(alpha);
  return b / (1.0 - alpha);
}

double conventional_error_variance_limit(double sigma2, double alpha) {
  require_alpha(alpha);
  return sigma2 / (1.0 - alpha * alpha);
}

double shared_checkpoint_error_mean_limit(double b, double alpha, int window) {
  require_alpha(alpha);
  require_window(window);
  return b / (1.0 - std::pow(alpha, window));
}

double shared_checkpoint_error_variance_limit(double sigma2, double alpha, int window) {
  require_alpha(alpha);
  require_window(window);
  return sigma2 / (1.0 - std::pow(alpha, 2.0 * window));
}

double separate_output_error_mean(double b, double alpha, int h) {
  require_alpha(alpha);
  return std::pow(alpha, h) * b;
}

double separate_output_error_variance(double sigma2, double alpha, int h) {
  require_alpha(alpha);
  return std::pow(alpha, 2.0 * h) * sigma2;
}

}  // namespace replayssm::ssm
