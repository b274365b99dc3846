#include "eval/policy_set.h"

#include <cctype>

#include <fmt/format.h>

namespace replayssm::eval {

using ssm::DecodeScheme;
using ssm::PrecisionPolicy;

// ---- configurations ----------------------------------------------------------------------------

std::vector<std::string> default_policy_specs() {
  return {"shared:fp16+sr",        "shared:fp8b128+sr",        "shared:nvfp4+sr",
          "shared:fp16+rtn",       "shared:fp8b128+rtn",       "shared:nvfp4+rtn",
          "split:nvfp4+rtn/fp32",  "split:nvfp4+rtn/fp16+sr",  "split:nvfp4+rtn/fp8b128+sr"};
}

namespace {

std::string trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return std::string(s);
}

bool takes_window(std::string_view spec) {
  const std::size_t colon = spec.find(':');
  const std::string scheme = trim(spec.substr(0, colon));
  return scheme == "shared" || scheme == "split";
}

}  // namespace

std::vector<std::string> split_policy_list(std::string_view text) {
  std::vector<std::string> out;
  std::size_t start = 0;
  while (start <= text.size()) {
    const std::size_t comma = text.find(',', start);
    const std::string piece = trim(text.substr(start, comma == std::string_view::npos ? std::string_view::npos
                                                                                       : comma - start));
    if (!piece.empty()) {
      if (piece.rfind("seed=", 0) == 0 && !out.empty())
        out.back() += "," + piece;
      else
        out.push_back(piece);
    }
    if (comma == std::string_view::npos) break;
    start = comma + 1;
  }
  return out;
}

bool uses_stochastic_rounding(const PrecisionPolicy& p) {
  const auto sr = [](const ssm::StateFormat& f) {
    return f.format != formats::StorageFormat::fp32 && f.rounding == formats::Rounding::sr;
  };
  return sr(p.recur) || (p.scheme == DecodeScheme::split && sr(p.read));
}

std::vector<PrecisionPolicy> expand_policies(const std::vector<std::string>& specs, const std::vector<int>& windows_in,
                                             const std::vector<uint64_t>& seeds_in) {
  const std::vector<int> windows = windows_in.empty() ? std::vector<int>{kDefaultWindow} : windows_in;
  const std::vector<uint64_t> seeds = seeds_in.empty() ? std::vector<uint64_t>{0} : seeds_in;
  std::vector<PrecisionPolicy> out;
  const auto add = [&out](const PrecisionPolicy& p) {
    for (const auto& q : out)
      if (q == p) return;
    out.push_back(p);
  };
  for (const std::string& raw : specs) {
    const std::string spec = trim(raw);
    const std::size_t comma = spec.find(',');
    const std::string main = spec.substr(0, comma);
    const std::string options = comma == std::string::npos ? "" : spec.substr(comma);
    const bool has_seed = options.find("seed=") != std::string::npos;
    std::vector<std::string> texts;
    if (main.find('@') == std::string::npos && takes_window(main)) {
      for (int L : windows) texts.push_back(fmt::format("{}@{}{}", main, L, options));
    } else {
      texts.push_back(spec);
    }
    for (const std::string& t : texts) {
      PrecisionPolicy p = PrecisionPolicy::parse(t);
      if (has_seed || !uses_stochastic_rounding(p)) {
        add(p);
        continue;
      }
      for (uint64_t s : seeds) {
        p.seed = s;
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
  return j;
}

}  // namespace replayssm::eval
