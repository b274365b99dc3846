// The cell store of a KL sweep: its identity, the resume decisions, the cell files and the merge
// into the result file (the rules are at the top of kl_sweep.h).
#pragma once
#include <cstdint>
#include <filesystem>
#include <iosfwd>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "eval/kl_sweep.h"
#include "eval/results_file.h"

namespace replayssm::io {
class FileLock;
}

namespace replayssm::eval {

// The identity of a sweep (see kl_sweep.h): what determines its numbers.
nlohmann::json sweep_identity(const TeacherForcedModel& model, const std::vector<SweepBook>& books,
                              const SweepOptions& options, const std::string& compute = "fp32");
// "n_positions: 4096 -> 8192; configs: added shared:fp16+sr@16" (empty when equal).
std::string describe_identity_difference(const nlohmann::json& old_id, const nlohmann::json& new_id);

// The files of one sweep output DIR/NAME: the result file, DIR/.NAME.lock and the work directory
// DIR/.NAME.parts with sweep.json and one cell file per finished (configuration, book).
class CellStore {
 public:
  // policies and books: the canonical policy strings and book names, in sweep order. Touches nothing.
  CellStore(std::string out_path, nlohmann::json identity, std::vector<std::string> policies,
            std::vector<std::string> books, int64_t n_positions, std::ostream& log);
  ~CellStore();
  CellStore(const CellStore&) = delete;
  CellStore& operator=(const CellStore&) = delete;

  // When the result file already holds this sweep, complete, returns its summary: found without
  // the lock and without writing anything (a finished result on a read-only filesystem is still
  // reported); a work directory left next to it is removed when the lock can be had. Otherwise
  // takes the lock, checks the result file again under it, applies the resume rules (force:
  // replace a different result, discard a different sweep's cells) and finds the finished cells;
  // returns nullopt. Throws std::runtime_error on refusals, saying what differs.
  std::optional<ResultsSummary> open(bool force);

  // A sharded sweep (sweep_team.h): rank 0 open()s the store and hands the other ranks its map of
  // finished cells (done_map()[config][book] != 0); each of them attach()es: no lock and no
  // clean-up (rank 0 holds the lock for all), but a check that the work directory is there with
  // this sweep's identity, i.e. that this rank sees rank 0's filesystem (std::runtime_error
  // otherwise). Every rank then write()s the cells it computes.
  const std::vector<std::vector<uint8_t>>& done_map() const { return done_; }
  void attach(std::vector<std::vector<uint8_t>> done);

  bool done(std::size_t config, std::size_t book) const;
  int64_t cells_done() const;
  // Stores a finished cell; fills in its identity fields (sweep id, policy, book, indices).
  void write(std::size_t config, std::size_t book, CellRecord cell);

  // One configuration of the result file: its JSON description (attribute "config").
  // Merges every cell into the result file, one configuration at a time (memory B x N floats),
  // commits it, removes the work directory and releases the lock. `meta` gets the builds and host
  // ISAs of the cells. Returns the aggregate statistics per configuration, in order.
  std::vector<SummaryRow> merge(ResultsMetadata meta, const std::vector<ResultsBook>& books,
                                const std::vector<std::string>& config_jsons);

 private:
  // The existing result file when it holds this sweep, complete; nullopt when there is none (or
  // force); throws when it is something else.
  std::optional<ResultsSummary> existing_result(bool force) const;
  // A cell file that belongs to this sweep at (config, book); throws naming it otherwise.
  CellRecord read_matching(std::size_t config, std::size_t book) const;
  std::filesystem::path cell_path(std::size_t config, std::size_t book) const;
  void take_lock();

  std::filesystem::path out_, dir_, work_;
  std::string name_;
  nlohmann::json identity_;
  std::string sweep_id_;
  std::vector<std::string> policies_, books_;
  int64_t n_;
  std::ostream& log_;
  std::unique_ptr<io::FileLock> lock_;
  std::vector<std::vector<uint8_t>> done_;
  int64_t cells_done_ = 0;
};

}  // namespace replayssm::eval
