// PrecisionPolicy text form. Grammar (whitespace around the whole text is ignored):
//   policy  := scheme ':' body options
//   body    := fmt ['@1']            (conv; conventional decode is window 1)
//            | fmt '@' L             (shared)
//            | fmt '/' fmt '@' L     (split: read format, then recurrence format)
//   options := (',seed=' N | ',skip=' ('auto' | T))*   each at most once; skip not for conv
//   fmt     := format ['+' ('rtn' | 'sr' | 'ef')]   format: fp32 fp16 bf16 e4m3 e2m1 fp8b128 (fp8) nvfp4
// A spec (parse_policy_spec) may omit '@L' for shared and split as well.
// fp32 takes no rounding. Omitted rounding: rtn, except the recurrence format of a split
// policy, which defaults to sr. Canonical form (to_string): every non-fp32 format carries its
// rounding, ",seed=N" only when N != 0, scheme "conv", format names as formats::to_string.
#include "ssm/precision_policy.h"

#include <charconv>
#include <limits>
#include <stdexcept>

#include <fmt/format.h>

namespace replayssm::ssm {

namespace {

[[noreturn]] void fail(std::string_view text, const std::string& what) {
  throw std::invalid_argument(fmt::format(
      "invalid precision policy '{}': {} (expected e.g. 'conv:fp32', 'shared:nvfp4+sr@16', "
      "'split:nvfp4+rtn/fp16+sr@16', 'conv:fp16+ef', optionally followed by ',seed=N')",
      text, what));
}

std::string_view trim(std::string_view s) {
  const auto space = [](char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; };
  while (!s.empty() && space(s.front())) s.remove_prefix(1);
  while (!s.empty() && space(s.back())) s.remove_suffix(1);
  return s;
}

// Parses all of `digits` as an unsigned decimal number; false on anything else or overflow.
bool parse_unsigned(std::string_view digits, uint64_t& value) {
  if (digits.empty()) return false;
  for (char c : digits)
    if (c < '0' || c > '9') return false;
  const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), value);
  return ec == std::errc() && end == digits.data() + digits.size();
}

StateFormat parse_format(std::string_view text, std::string_view spec, formats::Rounding default_rounding,
                         std::string_view role) {
  if (spec.empty()) fail(text, fmt::format("missing {} format", role));
  const std::size_t plus = spec.find('+');
  const std::string_view name = spec.substr(0, plus);
  StateFormat f;
  try {
    f.format = formats::parse_storage_format(name);
  } catch (const std::invalid_argument& e) {
    fail(text, fmt::format("{} format: {}", role, e.what()));
  }
  if (plus == std::string_view::npos) {
    f.rounding = f.format == formats::StorageFormat::fp32 ? formats::Rounding::rtn : default_rounding;
    return f;
  }
  const std::string_view rounding = spec.substr(plus + 1);
  if (f.format == formats::StorageFormat::fp32)
    fail(text, fmt::format("{} format 'fp32' takes no rounding, got '+{}'", role, rounding));
  try {
    f.rounding = formats::parse_rounding(rounding);
  } catch (const std::invalid_argument& e) {
    fail(text, fmt::format("{} format '{}': {}", role, spec, e.what()));
  }
  return f;
}

CheckpointSkip parse_skip(std::string_view text, std::string_view value) {
  CheckpointSkip skip;
  if (value == "auto") {
    skip.mode = CheckpointSkip::Mode::automatic;
    return skip;
  }
  float t = 0.0f;
  const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), t);
  if (value.empty() || ec != std::errc() || end != value.data() + value.size() || !(t > 0.0f && t < 1.0f))
    fail(text, fmt::format("skip must be 'auto' or a decay threshold T with 0 < T < 1, got '{}'", value));
  skip.mode = CheckpointSkip::Mode::fixed;
  skip.threshold = t;
  return skip;
}

int parse_window(std::string_view text, std::string_view digits) {
  uint64_t L = 0;
  if (!parse_unsigned(digits, L))
    fail(text, fmt::format("window after '@' must be a positive integer, got '{}'", digits));
  if (L < 1) fail(text, fmt::format("window L must be at least 1, got '{}'", digits));
  if (L > static_cast<uint64_t>(kMaxWindow))
    fail(text, fmt::format("window L = {} is larger than the supported maximum {}", digits, kMaxWindow));
  return static_cast<int>(L);
}

std::string format_to_string(const StateFormat& f) {
  if (f.format == formats::StorageFormat::fp32) return "fp32";
  return fmt::format("{}+{}", formats::to_string(f.format), formats::to_string(f.rounding));
}

}  // namespace

PolicySpec parse_policy_spec(std::string_view raw) {
  const std::string_view text = trim(raw);
  if (text.empty()) fail(raw, "empty text");
  PolicySpec spec;
  spec.text = std::string(text);
  PrecisionPolicy& p = spec.policy;

  // Options after the first ','.
  std::string_view main = text;
  const std::size_t comma = text.find(',');
  bool have_skip = false;
  if (comma != std::string_view::npos) {
    main = text.substr(0, comma);
    std::string_view rest = text.substr(comma + 1);
    bool have_seed = false;
    while (true) {
      const std::size_t next = rest.find(',');
      const std::string_view option = rest.substr(0, next);
      const std::size_t eq = option.find('=');
      const std::string_view key = option.substr(0, eq);
      const std::string_view value = eq == std::string_view::npos ? std::string_view{} : option.substr(eq + 1);
      if (eq == std::string_view::npos || (key != "seed" && key != "skip"))
        fail(text, fmt::format("unknown option '{}' after ',': 'seed=N' and 'skip=auto|T' are accepted", option));
      if (key == "seed") {
        if (have_seed) fail(text, "'seed' given twice");
        if (!parse_unsigned(value, p.seed))
          fail(text, fmt::format("seed must be an unsigned 64-bit decimal integer, got '{}'", value));
        have_seed = spec.seed_given = true;
      } else {
        if (have_skip) fail(text, "'skip' given twice");
        p.skip = parse_skip(text, value);
        have_skip = true;
      }
      if (next == std::string_view::npos) break;
      rest = rest.substr(next + 1);
    }
  }

  const std::size_t colon = main.find(':');
  if (colon == std::string_view::npos)
    fail(text, fmt::format("missing ':' after the scheme in '{}'; schemes are conv, shared, split", main));
  const std::string_view scheme = main.substr(0, colon);
  std::string_view body = main.substr(colon + 1);
  if (scheme == "conv" || scheme == "conventional") {
    p.scheme = DecodeScheme::conventional;
  } else if (scheme == "shared") {
    p.scheme = DecodeScheme::shared;
  } else if (scheme == "split") {
    p.scheme = DecodeScheme::split;
  } else {
    fail(text, fmt::format("unknown scheme '{}': expected conv, shared or split", scheme));
  }

  const std::size_t at = body.find('@');
  std::string_view formats_part = body.substr(0, at);
  if (at != std::string_view::npos) {
    const std::string_view window = body.substr(at + 1);
    p.window = parse_window(text, window);
    spec.window_given = true;
    if (p.scheme == DecodeScheme::conventional && p.window != 1)
      fail(text, fmt::format("conventional decode is window 1 by definition, got '@{}'", window));
  }

  if (have_skip && p.scheme == DecodeScheme::conventional)
    fail(text, "'skip' is for shared and split policies: conventional decode reads its state every step by definition");

  const std::size_t slash = formats_part.find('/');
  if (p.scheme == DecodeScheme::split) {
    if (slash == std::string_view::npos)
      fail(text, fmt::format("split needs two formats 'READ/RECUR' (read format first), got '{}'", formats_part));
    const std::string_view second = formats_part.substr(slash + 1);
    if (second.find('/') != std::string_view::npos)
      fail(text, fmt::format("split takes exactly two formats, got '{}'", formats_part));
    p.read = parse_format(text, formats_part.substr(0, slash), formats::Rounding::rtn, "read");
    p.recur = parse_format(text, second, formats::Rounding::sr, "recurrence");
  } else {
    if (slash != std::string_view::npos)
      fail(text, fmt::format("only split policies take two formats 'READ/RECUR', got '{}' for {}", formats_part,
                             scheme));
    p.recur = parse_format(text, formats_part, formats::Rounding::rtn, "state");
  }
  return spec;
}

PrecisionPolicy PrecisionPolicy::parse(std::string_view raw) {
  const PolicySpec spec = parse_policy_spec(raw);
  if (!spec.window_given && spec.policy.scheme != DecodeScheme::conventional) {
    PrecisionPolicy example = spec.policy;
    example.window = 16;
    fail(spec.text, fmt::format("missing window '@L': {} policies need one, e.g. '{}'",
                                spec.policy.scheme == DecodeScheme::shared ? "shared" : "split", example.to_string()));
  }
  return spec.policy;
}

std::string PrecisionPolicy::to_string() const {
  std::string s;
  switch (scheme) {
    case DecodeScheme::conventional: s = "conv:" + format_to_string(recur); break;
    case DecodeScheme::shared: s = fmt::format("shared:{}@{}", format_to_string(recur), window); break;
    case DecodeScheme::split:
      s = fmt::format("split:{}/{}@{}", format_to_string(read), format_to_string(recur), window);
      break;
  }
  if (seed != 0) s += fmt::format(",seed={}", seed);
  if (skip.mode == CheckpointSkip::Mode::automatic) s += ",skip=auto";
  if (skip.mode == CheckpointSkip::Mode::fixed) s += fmt::format(",skip={}", skip.threshold);  // shortest round trip
  return s;
}

float CheckpointSkip::threshold_for(const StateFormat& f) const {
  switch (mode) {
    case Mode::off: return 0.0f;
    case Mode::automatic: return formats::unit_roundoff(f.format);
    case Mode::fixed: return threshold;
  }
  return 0.0f;
}

bool PrecisionPolicy::is_fp32_exact() const {
  if (skip.mode != CheckpointSkip::Mode::off) return false;  // a skipped read drops gamma_h S_ckpt
  const bool recur32 = recur.format == formats::StorageFormat::fp32;
  if (scheme == DecodeScheme::split) return recur32 && read.format == formats::StorageFormat::fp32;
  return recur32;
}

bool PrecisionPolicy::uses_rounding(formats::Rounding r) const {
  const auto rounds = [r](const StateFormat& f) { return f.format != formats::StorageFormat::fp32 && f.rounding == r; };
  return rounds(recur) || (scheme == DecodeScheme::split && rounds(read));
}

}  // namespace replayssm::ssm
