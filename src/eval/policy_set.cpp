#include "eval/policy_set.h"

#include <algorithm>
#include <stdexcept>

#include <fmt/format.h>

namespace replayssm::eval {

using ssm::DecodeScheme;
using ssm::PrecisionPolicy;

// ---- configurations ----------------------------------------------------------------------------

namespace {

constexpr const char* kListForm =
    "a policy list is P1,P2,... with each P = SCHEME:FORMAT[/FORMAT][@L][,seed=N], e.g. "
    "'shared:nvfp4+sr@16,seed=1,split:nvfp4/fp32'";

std::string_view trim(std::string_view s) {
  const auto space = [](char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; };
  while (!s.empty() && space(s.front())) s.remove_prefix(1);
  while (!s.empty() && space(s.back())) s.remove_suffix(1);
  return s;
}

// A piece between commas is an option of the policy before it when it holds '=' and no ':'.
bool is_option(std::string_view piece) {
  return piece.find('=') != std::string_view::npos && piece.find(':') == std::string_view::npos;
}

bool takes_window(const PrecisionPolicy& p) { return p.scheme != DecodeScheme::conventional; }

}  // namespace

std::vector<ssm::PolicySpec> default_policy_specs() {
  return parse_policy_list(
      "shared:fp16+sr, shared:fp8b128+sr, shared:nvfp4+sr, shared:fp16+rtn, shared:fp8b128+rtn, shared:nvfp4+rtn, "
      "split:nvfp4+rtn/fp32, split:nvfp4+rtn/fp16+sr, split:nvfp4+rtn/fp8b128+sr");
}

std::vector<ssm::PolicySpec> parse_policy_list(std::string_view text) {
  if (trim(text).empty()) throw std::invalid_argument(fmt::format("empty policy list '{}': {}", text, kListForm));
  // The pieces between commas, as spans [begin, end) of text.
  struct Span {
    std::size_t begin, end;
  };
  std::vector<Span> pieces;
  for (std::size_t start = 0;;) {
    const std::size_t comma = std::min(text.find(',', start), text.size());
    pieces.push_back({start, comma});
    if (comma == text.size()) break;
    start = comma + 1;
  }
  const auto piece = [&](const Span& p) { return trim(text.substr(p.begin, p.end - p.begin)); };
  for (const Span& p : pieces) {
    if (piece(p).empty()) continue;
    if (is_option(piece(p)))
      throw std::invalid_argument(fmt::format(
          "policy list '{}': '{}' is an option, but no policy comes before it (an option such as ',seed=N' follows "
          "the policy it belongs to); {}",
          text, piece(p), kListForm));
    break;
  }
  // Each entry spans its policy and the options after it.
  std::vector<Span> entries;
  for (std::size_t i = 0; i < pieces.size(); ++i) {
    if (piece(pieces[i]).empty())
      throw std::invalid_argument(fmt::format(
          "policy list '{}': piece {} is empty (two commas in a row, or a comma at an end); {}", text, i + 1,
          kListForm));
    if (is_option(piece(pieces[i])))
      entries.back().end = pieces[i].end;
    else
      entries.push_back(pieces[i]);
  }
  std::vector<ssm::PolicySpec> specs;
  for (const Span& e : entries) {
    specs.push_back(ssm::parse_policy_spec(text.substr(e.begin, e.end - e.begin)));
    const ssm::PolicySpec& spec = specs.back();
    if (spec.seed_given && !uses_stochastic_rounding(spec.policy))
      throw std::invalid_argument(fmt::format(
          "policy list '{}': '{}' has ',seed=', but the policy uses no stochastic rounding, so the seed would change "
          "nothing but its name; drop the seed, or use '+sr'",
          text, spec.text));
  }
  return specs;
}

bool uses_stochastic_rounding(const PrecisionPolicy& p) { return p.uses_rounding(formats::Rounding::sr); }

std::vector<PrecisionPolicy> expand_policies(const std::vector<ssm::PolicySpec>& specs,
                                             const std::vector<int>& windows_in,
                                             const std::vector<uint64_t>& seeds_in) {
  const std::vector<int> windows = windows_in.empty() ? std::vector<int>{kDefaultWindow} : windows_in;
  const std::vector<uint64_t> seeds = seeds_in.empty() ? std::vector<uint64_t>{0} : seeds_in;
  for (std::size_t i = 0; i < windows.size(); ++i) {
    if (windows[i] < 1 || windows[i] > ssm::kMaxWindow)
      throw std::invalid_argument(
          fmt::format("window {} is outside [1, {}]: a window L is a number of steps", windows[i], ssm::kMaxWindow));
    if (std::find(windows.begin(), windows.begin() + static_cast<std::ptrdiff_t>(i), windows[i]) !=
        windows.begin() + static_cast<std::ptrdiff_t>(i))
      throw std::invalid_argument(fmt::format("window {} is listed twice", windows[i]));
  }
  for (std::size_t i = 0; i < seeds.size(); ++i)
    if (std::find(seeds.begin(), seeds.begin() + static_cast<std::ptrdiff_t>(i), seeds[i]) !=
        seeds.begin() + static_cast<std::ptrdiff_t>(i))
      throw std::invalid_argument(fmt::format("seed {} is listed twice", seeds[i]));

  std::vector<PrecisionPolicy> out;
  const auto add = [&out](const PrecisionPolicy& p) {
    if (std::find(out.begin(), out.end(), p) == out.end()) out.push_back(p);
  };
  for (const ssm::PolicySpec& spec : specs) {
    const bool sr = uses_stochastic_rounding(spec.policy);
    const std::vector<int> spec_windows =
        spec.window_given || !takes_window(spec.policy) ? std::vector<int>{spec.policy.window} : windows;
    const std::vector<uint64_t> spec_seeds = spec.seed_given || !sr ? std::vector<uint64_t>{spec.policy.seed} : seeds;
    for (int L : spec_windows) {
      for (uint64_t seed : spec_seeds) {
        PrecisionPolicy p = spec.policy;
        p.window = L;
        p.seed = seed;
        add(p);
      }
    }
  }
  return out;
}

nlohmann::json policy_json(const PrecisionPolicy& p) {
  const auto fmt_json = [](const ssm::StateFormat& f) {
    return nlohmann::json{{"format", std::string(formats::to_string(f.format))},
                          {"rounding", f.format == formats::StorageFormat::fp32 ? std::string("none")
                                                                                : std::string(formats::to_string(f.rounding))}};
  };
  nlohmann::json j;
  j["policy"] = p.to_string();
  j["scheme"] = p.scheme == DecodeScheme::conventional ? "conv" : p.scheme == DecodeScheme::shared ? "shared" : "split";
  j["recur"] = fmt_json(p.recur);
  if (p.scheme == DecodeScheme::split) j["read"] = fmt_json(p.read);
  j["window"] = p.window;
  j["seed"] = p.seed;
  j["stochastic_rounding"] = uses_stochastic_rounding(p);
  j["error_feedback"] = p.uses_rounding(formats::Rounding::ef);
  return j;
}

}  // namespace replayssm::eval
