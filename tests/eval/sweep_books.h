// Random books for the sweep tests (test_kl_sweep, test_sweep_team): `count` books of `n_tokens`
// ids in [0, vocab), named book00, book01, ..., from a seeded generator.
#pragma once
#include <boost/random/mersenne_twister.hpp>
#include <boost/random/uniform_int_distribution.hpp>
#include <cstdint>
#include <vector>

#include <fmt/format.h>

#include "eval/kl_sweep.h"
#include "io/text_source.h"

namespace replayssm::test {

inline std::vector<eval::SweepBook> make_books(int count, int n_tokens, int vocab, uint64_t seed) {
  boost::random::mt19937_64 rng(seed);
  boost::random::uniform_int_distribution<int> tok(0, vocab - 1);
  std::vector<eval::SweepBook> books;
  for (int b = 0; b < count; ++b) {
    eval::SweepBook sb;
    sb.name = fmt::format("book{:02}", b);
    sb.source = sb.name + ".txt";
    sb.tokens.resize(static_cast<std::size_t>(n_tokens));
    for (auto& t : sb.tokens) t = tok(rng);
    sb.n_tokens = n_tokens;
    sb.text_fnv1a64 = io::hex64(io::fnv1a64(sb.tokens.data(), sb.tokens.size()));
    books.push_back(std::move(sb));
  }
  return books;
}

}  // namespace replayssm::test
