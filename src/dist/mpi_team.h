// The MPI side of a sharded KL sweep (eval::SweepTeam, src/eval/sweep_team.h; docs/MPI_SWEEP.md):
// `mpirun -n R replayssm kl-sweep ...` or `srun replayssm kl-sweep ...`. Built only when CMake
// finds MPI (REPLAYSSM_MPI, CMakeLists.txt); nothing else in the toolkit includes mpi.h.
//
// Messages: rank 0 broadcasts the resume state once; a book's reference goes from the rank that
// computed it to each rank with cells of that book by non-blocking sends (pieces of at most 2^28
// floats, tag 2 + book), moved by MPI whenever the sender next calls it (between chunks, while
// it waits for a reference, at the end; over TCP by Open MPI's progress thread); progress counts
// (tag 0) go to rank 0 at most twice a second; at the end every rank tells rank 0 its cell count
// (tag 1). Only the main thread calls MPI (MPI_THREAD_FUNNELED): the model's worker threads never do.
#pragma once
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "eval/sweep_team.h"

namespace replayssm::dist {

class MpiTeam final : public eval::SweepTeam {
 public:
  // MPI_Init_thread; the world communicator is the team. Call once, before any other MPI use.
  static std::unique_ptr<MpiTeam> join();
  ~MpiTeam() override;  // MPI_Finalize (every rank calls it; it returns when all have)
  MpiTeam(const MpiTeam&) = delete;
  MpiTeam& operator=(const MpiTeam&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  // This process among those of its node (MPI_COMM_TYPE_SHARED): GPU binding and threads per rank.
  int local_rank() const { return local_rank_; }
  int local_size() const { return local_size_; }
  std::string library_version() const;  // "Open MPI v4.1.4, ..." (first line)
  // Ends every rank of the job (MPI_Abort): a rank that failed cannot leave the others waiting.
  [[noreturn]] void abort(int exit_code);

  void broadcast(std::string& bytes) override;
  void send_reference(std::size_t book, std::shared_ptr<const std::vector<float>> hidden,
                      const std::vector<int>& to) override;
  std::vector<float> receive_reference(std::size_t book, int from, std::size_t floats) override;
  void report_progress(int64_t done) override;
  int64_t others_progress() override;
  int64_t finish(int64_t cells_run, const std::function<void()>& waiting) override;

 private:
  MpiTeam();
  struct Pending;
  // Completes what it can of the pending sends (MPI_Testall), dropping the finished ones.
  void poll();
  int reference_tag(std::size_t book) const;

  int rank_ = 0, size_ = 1, local_rank_ = 0, local_size_ = 1, tag_ub_ = 32767;
  std::deque<std::unique_ptr<Pending>> pending_;
  std::vector<int64_t> progress_;  // rank 0: the latest report of each rank
  double last_report_ = -1e300;
  int64_t last_done_ = 0;
  bool finalize_ = true;
};

}  // namespace replayssm::dist
