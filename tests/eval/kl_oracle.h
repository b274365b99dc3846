// The float64 oracle of the KL tests: the definition, directly. Both log-prob rows are
// renormalised, then KL = sum_v p (log p - log q).
#pragma once
#include <cmath>

namespace replayssm::test {

inline double direct_kl(const float* a, const float* b, int vocab) {
  double za = 0, zb = 0;
  for (int i = 0; i < vocab; ++i) {
    za += std::exp(double(a[i]));
    zb += std::exp(double(b[i]));
  }
  double kl = 0;
  for (int i = 0; i < vocab; ++i) {
    const double p = std::exp(double(a[i])) / za;
    if (p > 0) kl += p * (std::log(p) - (double(b[i]) - std::log(zb)));
  }
  return kl;
}

}  // namespace replayssm::test
