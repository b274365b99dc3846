// The teacher-forced KL sweep (REPLAYSSM.md section 10): for every book, the FP32 reference
// (conv:fp32) runs once and its final hidden states are kept; then every configuration runs the
// same tokens under its precision policy and both next-token distributions are compared chunk by
// chunk (chunk_rows positions at a time), so memory is O(N d + chunk_rows vocab), never N x vocab.
//
// ---- Persistence, resume and atomicity ---------------------------------------------------------
// The unit of work is a cell = (configuration, book). Books are the outer loop (the reference's
// hidden states of one book are reused by every configuration; keeping them for all books would
// be B x N x d floats), so a configuration is finished only with the last book: persisting whole
// configurations would lose up to a full pass over the books on an interruption. Instead:
//   DIR/.NAME.lock          flock()ed for the whole run: a second sweep on the same output stops
//                           at once with a message instead of interleaving writes;
//   DIR/.NAME.parts/        the work directory of an unfinished sweep:
//       sweep.json          the sweep's identity (below), written first;
//       c0003-b0012.h5      one file per finished cell (per-position KL + exact statistics),
//                           each written to .c0003-b0012.h5.tmp-PID and renamed, so a cell file
//                           exists only when complete;
//   DIR/NAME                the result file (results_file.h schema), written when every cell is
//                           done: built in memory, then written to DIR/.NAME.tmp-PID, fsync,
//                           rename over NAME, fsync DIR. Then the work directory and the lock
//                           file are removed. Every temporary is named .X.tmp-PID after its own
//                           file X (io/atomic_file.h), so cleaning up never touches the files of
//                           another output in DIR (px.h5 and px.h5.2 are separate sweeps).
// Why not one file rewritten after each configuration: HDF5 (1.10) has no journal, so a file
// modified in place and interrupted can be unreadable, and rewriting the whole file after every
// cell costs O(cells x file size). Cell files cost one small atomic write each; the merge reads
// them back one configuration at a time (memory B x N floats). Leftover .NAME.tmp-PID files of a
// killed run (dead PID only) are removed by the next run that holds the lock. The code: the
// cell store (cell_store.h: identity, resume, cells, merge) and run_kl_sweep below.
//
// Several processes (options.team, sweep_team.h; docs/MPI_SWEEP.md): rank 0 alone takes the lock,
// applies the rules below, cleans up and merges; it hands the other ranks the map of finished
// cells; every rank writes the cell files of the cells it computes into the same work directory,
// each atomically as above, the moment the cell is done (DIR must be shared by the ranks' hosts).
// So the files, the resume and the lock are the single process's, and a rank that dies loses only
// its own unfinished cell.
//
// Resume rules (out = DIR/NAME):
//   out exists, same identity          -> nothing to do ("already complete"), its summary is shown;
//                                         found without the lock and without writing anything, so
//                                         a finished result on a read-only filesystem is reported;
//   out exists, different identity     -> refused (std::runtime_error saying what differs) unless
//                                         force; out exists but is no result file (or one not
//                                         marked complete) -> refused too;
//   work dir exists, same identity     -> finished cells are skipped, the rest run, then merge
//                                         (with or without force: an interrupted forced run resumes);
//   work dir exists, different identity -> refused unless force (then the work dir is wiped);
//   force                              -> every cell not in a matching work dir is computed; out is
//                                         replaced only at the final rename, so an interrupted forced
//                                         run leaves the old file intact. To recompute everything,
//                                         delete DIR/.NAME.parts.
// The identity (JSON, root attribute "sweep") holds what determines the numbers: schema version,
// reference policy, N, the model's content hash and description, the tokenizer, every book's
// name, stripped-text hash and hash of the N + 1 token ids used, the configurations' canonical
// policy strings in order, and the engine's compute precision when it is not fp32 (--compute bf16
// changes the numbers; the device does not, beyond rounding, and is recorded per cell instead).
// Below FP32 compute the sweep has one more configuration, compute_noise_floor_name(compute)
// (sweep_engine.h): KL of the reference at FP32 compute against the reference at this compute, the
// noise floor the configurations are measured against; it is stored and resumed like the others. Paths, the command line, chunk size, thread count and the time are
// recorded but are not part of it. A resumed sweep built from a different commit is allowed; the
// builds that contributed are listed in the root attribute toolkit_versions_used.
#pragma once
#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

#include "eval/policy_set.h"
#include "eval/progress.h"
#include "eval/sweep_engine.h"
#include "eval/sweep_team.h"
#include "model/teacher_forced_model.h"
#include "ssm/precision_policy.h"

namespace replayssm::eval {

// The sweep runs on the teacher-forced model contract (model/teacher_forced_model.h).
using model::RowMatrixXf;
using model::TeacherForcedModel;

// ---- the sweep ---------------------------------------------------------------------------------

struct SweepBook {
  std::string name, source;
  std::string text_fnv1a64;      // of the stripped text
  int64_t n_tokens = 0;          // available in the whole book
  std::vector<int32_t> tokens;   // at least n_positions + 1; the first n_positions + 1 are used
};

struct SweepOptions {
  int64_t n_positions = 0;                          // N: KL positions per book
  std::vector<ssm::PrecisionPolicy> policies;       // the configurations, in order
  std::string reference = "conv:fp32";
  int chunk_rows = 1024;                            // positions per log_probs call
  int threads = 0;                                  // KL worker threads (0: hardware)
  std::string out_path;
  bool force = false;
  // Recorded in the result file, not part of the identity.
  std::string command_line, model_dir, text_dir, tokens_dir, tokenizer = "bytes", tokenization;
  // Console: log lines and progress go to `log` (stderr in the CLI); progress: "auto" (a bar
  // redrawn in place when log is a terminal, else lines), "bar", "lines", "off".
  std::ostream* log = nullptr;
  std::string progress = "auto";
  double progress_interval_s = 30.0;
  // Several processes share the sweep (sweep_team.h, docs/MPI_SWEEP.md) when this is set and has
  // more than one rank; null (or one rank): this process alone, as always.
  SweepTeam* team = nullptr;
};

struct SweepOutcome {
  std::string path;
  bool already_complete = false;   // the result file existed with the same identity
  int64_t cells_total = 0, cells_resumed = 0, cells_run = 0;
  double seconds = 0.0;
  std::vector<SummaryRow> rows;    // aggregate statistics per configuration, in order
};

// Runs (or resumes, or finds complete) the sweep and returns the summary. With a team, every rank
// calls it with the same books and options: rank 0 takes the lock, decides the resume and writes
// the result file (its outcome counts every rank's cells; the other ranks' outcomes have no rows). Throws
// std::invalid_argument on bad options (N < 1, no configuration, short books, token ids outside
// the vocabulary), std::runtime_error on refused outputs, model outputs of the wrong shape and
// I/O errors. Finished cells survive any exception.
SweepOutcome run_kl_sweep(SweepEngine& engine, const std::vector<SweepBook>& books, const SweepOptions& options);
// The same on the CPU engine (make_cpu_engine(model, options.threads)).
SweepOutcome run_kl_sweep(TeacherForcedModel& model, const std::vector<SweepBook>& books, const SweepOptions& options);

}  // namespace replayssm::eval
