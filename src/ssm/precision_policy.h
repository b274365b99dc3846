// A precision policy names one way of storing and decoding SSM state (REPLAYSSM.md sections 2-4):
//   conventional  the state is read, updated and written back every step, stored in `recur`;
//   shared        ReplaySSM with one checkpoint in `recur`, read by every step and carrying the
//                 recurrence, flushed every `window` steps (Algorithms 1 and 4);
//   split         ReplaySSM with separate checkpoints (Algorithm 3): `read` (low precision, RTN)
//                 is read by non-flush steps only; `recur` (high precision, FP32 or SR) carries
//                 the recurrence and is read by flush steps.
// String form (CLI, configs, result files), canonical output of to_string():
//   conv:fp32                   conv:fp16+sr            conv:nvfp4+rtn
//   shared:nvfp4+sr@16          shared:fp32@16
//   split:nvfp4+rtn/fp32@16     split:nvfp4/fp16+sr@16  (read format first, then recurrence format)
//   conv:fp16+ef                split:nvfp4+ef/fp32@16  (error feedback, formats/quantized_matrix.h)
//   any of them may end in ",seed=N" (default seed 0); shared and split ones in ",skip=auto" or
//   ",skip=T" (appendix F: CheckpointSkip below), in either order (canonical: seed first).
// Rounding defaults when omitted: rtn, except a split policy's recurrence format, which defaults
// to sr (the paper's configuration); fp32 takes no rounding.
// A policy *spec* (parse_policy_spec) is the same text with '@L' optional for shared and split too:
// policy lists (eval/policy_set.h) leave out the window and seed that a sweep fills in.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>

#include "formats/quantized_matrix.h"

namespace replayssm::ssm {

inline constexpr int kMaxWindow = 1 << 20;  // largest window L accepted anywhere

enum class DecodeScheme : uint8_t { conventional, shared, split };

struct StateFormat {
  formats::StorageFormat format = formats::StorageFormat::fp32;
  formats::Rounding rounding = formats::Rounding::rtn;
  bool operator==(const StateFormat&) const = default;
};

// Appendix F, decay-based checkpoint-read skipping. gamma_h = a_1 ... a_h, the decay a window's
// first h tokens apply to the checkpoint (KDA: the largest over key channels), is computed as a
// float32 running product from the window's start. A step whose gamma_h is below the threshold of
// the copy it would read replays from a zero state instead (the checkpoint is not read); a flush
// whose gamma_L is below the recur copy's threshold becomes a pure write. Dropping gamma_h S_ckpt
// moves the replayed state by at most gamma_h |S_ckpt| (the delta rule's (I - b k k^T) have norm
// <= 1), so below the copy's unit roundoff u (formats::unit_roundoff) it costs at most one
// rounding of that copy at the state's own scale: the threshold `auto` uses.
struct CheckpointSkip {
  enum class Mode : uint8_t { off, automatic, fixed };
  Mode mode = Mode::off;
  float threshold = 0.0f;  // fixed: in (0, 1)
  bool operator==(const CheckpointSkip&) const = default;
  // The gamma below which a step reading a copy stored in `f` skips it (0: never).
  float threshold_for(const StateFormat& f) const;
};

struct PrecisionPolicy {
  DecodeScheme scheme = DecodeScheme::conventional;
  StateFormat recur;    // the copy that carries the recurrence (conventional: the only copy)
  StateFormat read;     // split only: the low-precision copy read by non-flush steps
  int window = 1;       // L; conventional decode is window 1 by definition
  uint64_t seed = 0;    // stochastic-rounding seed
  CheckpointSkip skip;  // shared and split only
  bool operator==(const PrecisionPolicy&) const = default;

  // Throws std::invalid_argument quoting the text and saying what was expected.
  static PrecisionPolicy parse(std::string_view text);
  std::string to_string() const;
  // True when the policy is exact FP32 (conv:fp32, shared:fp32@L, split:fp32/fp32@L; no skip).
  bool is_fp32_exact() const;
  // True when a copy the policy stores below FP32 rounds by `r` (split: either copy).
  bool uses_rounding(formats::Rounding r) const;
};

// A policy as written, before a sweep fills in what was left out.
struct PolicySpec {
  PrecisionPolicy policy;      // window 1 and seed 0 where not written
  bool window_given = false;   // '@L' was written
  bool seed_given = false;     // ',seed=N' was written
  std::string text;            // as written (trimmed), for messages
};

// The grammar of PrecisionPolicy::parse with '@L' optional for every scheme. Throws
// std::invalid_argument like parse.
PolicySpec parse_policy_spec(std::string_view text);

}  // namespace replayssm::ssm
