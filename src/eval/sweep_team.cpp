#include "eval/sweep_team.h"

#include <algorithm>
#include <stdexcept>

#include <fmt/format.h>

namespace replayssm::eval {

ShardPlan plan_shards(const std::vector<std::vector<uint8_t>>& done, int ranks) {
  if (ranks < 1) throw std::invalid_argument(fmt::format("plan_shards: {} ranks", ranks));
  const std::size_t C = done.size(), B = C ? done.front().size() : 0;
  for (const auto& row : done)
    if (row.size() != B) throw std::invalid_argument("plan_shards: rows of the done map differ in length");
  // Books with unfinished cells, in order.
  std::vector<std::size_t> books;
  for (std::size_t b = 0; b < B; ++b)
    for (std::size_t c = 0; c < C; ++c)
      if (!done[c][b]) {
        books.push_back(b);
        break;
      }
  ShardPlan plan;
  plan.reference_rank.assign(B, -1);
  plan.receivers.assign(B, {});
  std::vector<int64_t> free_at(static_cast<std::size_t>(ranks), 0);  // when each rank is next idle
  std::vector<int64_t> ref_done(B, 0);                                // when each reference is ready
  const auto place = [&](ShardTask t, int64_t earliest_start) {
    int best = 0;
    int64_t best_end = INT64_MAX;
    for (int r = 0; r < ranks; ++r) {
      const int64_t end = std::max(free_at[static_cast<std::size_t>(r)], earliest_start) + 1;
      if (end < best_end) best = r, best_end = end;
    }
    free_at[static_cast<std::size_t>(best)] = best_end;
    t.rank = best;
    plan.tasks.push_back(t);
    plan.makespan = std::max(plan.makespan, best_end);
    return std::pair{best, best_end};
  };
  const auto reference = [&](std::size_t b) {
    const auto [rank, end] = place({ShardTask::Kind::reference, b, 0, 0}, 0);
    plan.reference_rank[b] = rank;
    ref_done[b] = end;
  };
  if (!books.empty()) reference(books.front());
  for (std::size_t i = 0; i < books.size(); ++i) {
    if (ranks > 1 && i + 1 < books.size()) reference(books[i + 1]);  // one book ahead
    if (ranks == 1 && i > 0) reference(books[i]);
    const std::size_t b = books[i];
    for (std::size_t c = 0; c < C; ++c) {
      if (done[c][b]) continue;
      const int rank = place({ShardTask::Kind::cell, b, c, 0}, ref_done[b]).first;
      std::vector<int>& to = plan.receivers[b];
      if (rank != plan.reference_rank[b] && std::find(to.begin(), to.end(), rank) == to.end()) to.push_back(rank);
    }
    std::sort(plan.receivers[b].begin(), plan.receivers[b].end());
  }
  return plan;
}

}  // namespace replayssm::eval
