#include "ssm/decoder.h"

#include <stdexcept>

#include <fmt/format.h>

namespace replayssm::ssm {

GroupToken token_of(const HeadGroupSequence& seq, int t) {
  if (t < 0 || t >= seq.n_tokens)
    throw std::out_of_range(fmt::format("token {} out of range [0, {})", t, seq.n_tokens));
  const int w = decay_width(seq.kind, seq.dk);
  GroupToken x;
  x.q = seq.q + static_cast<std::ptrdiff_t>(t) * seq.dk;
  x.k = seq.k + static_cast<std::ptrdiff_t>(t) * seq.dk;
  for (std::size_t g = 0; g < seq.alpha.size(); ++g) x.alpha.push_back(seq.alpha[g] + static_cast<std::ptrdiff_t>(t) * w);
  for (std::size_t g = 0; g < seq.beta.size(); ++g) x.beta.push_back(seq.beta[g][t]);
  for (std::size_t g = 0; g < seq.v.size(); ++g) x.v.push_back(seq.v[g] + static_cast<std::ptrdiff_t>(t) * seq.dv);
  return x;
}

void check_token(const HeadGroupShape& shape, const GroupToken& x) {
  const std::size_t G = static_cast<std::size_t>(shape.n_value_heads);
  if (x.q == nullptr || x.k == nullptr) throw std::invalid_argument("token: q and k must be given");
  if (x.alpha.size() != G || x.v.size() != G)
    throw std::invalid_argument(fmt::format("token: expected {} value heads, got {} alpha and {} v pointers", G,
                                            x.alpha.size(), x.v.size()));
  if (has_delta_rule(shape.kind) && x.beta.size() != G)
    throw std::invalid_argument(
        fmt::format("token: {} needs one beta per value head ({}), got {}", to_string(shape.kind), G, x.beta.size()));
  for (std::size_t g = 0; g < G; ++g)
    if (x.alpha[g] == nullptr || x.v[g] == nullptr)
      throw std::invalid_argument(fmt::format("token: null alpha or v pointer for value head {}", g));
}

}  // namespace replayssm::ssm
