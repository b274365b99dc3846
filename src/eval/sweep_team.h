// A KL sweep shared by several processes (`mpirun -n R replayssm kl-sweep ...`, docs/MPI_SWEEP.md):
// what the runner (kl_sweep.cpp) needs of the other processes, without MPI types, so the core
// library builds without MPI; the MPI implementation is src/dist/mpi_team.h. And the plan: which
// rank computes which book's reference and which (configuration, book) cells.
//
// The plan (plan_shards): the work of a sweep is a list of tasks, a book's reference forward and
// its unfinished cells, books in order, with more than one rank each reference scheduled one book
// ahead (ref(b + 1) comes before the cells of b), so that it is ready when the ranks reach that
// book (a rank that computed ref(b + 1) and still has cells of b keeps a host copy of it). Tasks are placed in
// that order on the rank where they would finish first (every task costs one unit, a cell cannot
// start before its book's reference is done; ties go to the lowest rank): a deterministic list
// schedule that every rank computes alike from the finished-cell map, so no rank has to ask which
// cells are its own, and a rerun with another R simply plans the cells still missing. A book's
// reference is computed once, by the rank of its reference task, and sent to the ranks with cells of
// that book; each rank runs its tasks in the global order, so a rank waiting for a reference waits
// for an earlier task, whose rank never waits for it: there is no deadlock.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace replayssm::eval {

struct ShardTask {
  enum class Kind { reference, cell };
  Kind kind = Kind::cell;
  std::size_t book = 0, config = 0;  // config: cells only
  int rank = 0;                      // who runs it
};

struct ShardPlan {
  std::vector<ShardTask> tasks;              // the global order; each rank runs its own in this order
  std::vector<int> reference_rank;           // per book: the rank computing its reference (-1: none needed)
  std::vector<std::vector<int>> receivers;   // per book: the other ranks with cells of it, ascending
  int64_t makespan = 0;                      // finish time of the schedule, in task units
};

// done[c][b] != 0: cell (c, b) is finished. ranks >= 1. With one rank: the serial order (each
// book's reference, then its cells).
ShardPlan plan_shards(const std::vector<std::vector<uint8_t>>& done, int ranks);

// The other processes of a sharded sweep, as the runner sees them. Rank 0 holds the output lock,
// decides the resume and writes the result file; every rank writes its own cell files.
class SweepTeam {
 public:
  virtual ~SweepTeam() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Collective: every rank's `bytes` becomes rank 0's.
  virtual void broadcast(std::string& bytes) = 0;
  // Starts sending a book's reference (its final hidden states) to `to`; returns at once. The
  // team keeps `hidden` alive until every receiver has it.
  virtual void send_reference(std::size_t book, std::shared_ptr<const std::vector<float>> hidden,
                              const std::vector<int>& to) = 0;
  // Waits for book `book`'s reference from rank `from`: exactly `floats` floats.
  virtual std::vector<float> receive_reference(std::size_t book, int from, std::size_t floats) = 0;
  // This rank's work done so far (tokens), reported now and then to rank 0; on rank 0: the
  // latest reports of the other ranks, summed. Neither waits.
  virtual void report_progress(int64_t done) = 0;
  virtual int64_t others_progress() = 0;
  // Collective, at the end: waits until this rank's references are delivered and every rank has
  // finished its tasks (rank 0 calls `waiting()` meanwhile, e.g. to redraw the progress bar);
  // returns the sum of `cells_run` over the ranks.
  virtual int64_t finish(int64_t cells_run, const std::function<void()>& waiting) = 0;
};

}  // namespace replayssm::eval
