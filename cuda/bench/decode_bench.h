// `replayssm bench`: times the decode kernels on the paper's model shapes against the copy
// bandwidth and the conventional kernel measured in the same run (REPLAYSSM.md sections 8-9);
// with `schemes`, figure 7's comparison of speculative state-recovery schemes instead.
#pragma once
#include <string>
#include <vector>

namespace replayssm::cuda {

struct BenchOptions {
  std::vector<std::string> shapes = {"nemotron-3-nano-4b", "nemotron-3-super", "qwen3.5-4b", "qwen3.5-122b-a10b",
                                     "kimi-linear-48b-a3b"};
  std::vector<int> batches = {1, 8, 32, 128, 256, 512};
  std::vector<int> windows = {8, 16, 32};
  std::vector<int> drafts = {1, 2, 4, 8};
  int repeats = 15;            // timed repetitions (median reported)
  std::string csv_out;         // optional: every measurement as CSV (RFC 4180: text fields quoted)
  bool force = false;          // replace csv_out when it exists (the CLI refuses it otherwise, before any GPU work)
  bool check = true;           // run one correctness check of each kernel before timing
  // Value heads per block of the standard replay step (ReplayConfig::heads_per_block; 0: the
  // launcher's choice). Verification keeps the launcher's choice.
  int heads_per_block = 0;
  // ReplayConfig::flush_heads_per_block of the standard replay step (0: heads_per_block if forced, else the
  // launcher's choice); KDA shapes ignore it here (their kernels refuse it).
  int flush_heads_per_block = 0;
  // Device memory for the bench's buffers, GiB (0: all that is free but max(1/4, 2 GiB)). Under a
  // profiler that replays kernels (Nsight Compute saves and restores the memory a kernel may write),
  // give a few GiB: one arena the size of the GPU cannot be saved.
  double arena_gib = 0.0;
  // Figure 7 alone (paper appendix A): the prior speculative state-recovery schemes
  // (cuda/ssm/prior_schemes.h) beside ReplaySSM's verification and the vLLM snapshot baseline, for
  // a = 1 and a = T, instead of the tables above. `replayssm bench --schemes` defaults to the paper's
  // setting: nemotron-3-super, B = 256, T in {2, 4, 8}.
  bool schemes = false;
  // Which rows of the main table to time (an ECMAScript regular expression searched in each row's label, e.g.
  // "non-flush read nvfp4"; empty: every row). A row that is timed is reported, so the rows a selected row is
  // measured against (its last column's reference: the conventional FP32 step, the FP32 non-flush read, the
  // flush step, the NVFP4 read) are timed and reported too. Each row's timing runs inside an NVTX range named
  // by its label (bench_row_range_name), so that a profiler can take one row's kernels by name.
  std::string rows;
  // Standard replay steps with ReplayConfig::flush_list (the bench knows which sequences flush at each step),
  // as a serving loop would run them; false: without, the flush kernel covering every sequence, for comparison.
  // GDN's appendix F rows with a read threshold run without either way (the launcher refuses a list there).
  bool flush_lists = true;
  // How a sample is timed. queued: each sample's work is queued behind a hold kernel before its first event, so
  // the events bracket the GPU's work alone (as the peers' CUDA-graph timer, scripts/bench_peers.py --timer graph).
  // events: the events also bracket the host's launch calls, as every run before 2026-12-06 session 27 timed.
  enum class Timer { queued, events };
  Timer timer = Timer::queued;
};

// Refuses options no run can honour, naming the option, what it accepts and the value (std::invalid_argument):
// an unknown shape, B < 1, a window L outside the kernels' 1..kMaxDecodeWindow, a draft count the
// verification kernels do not have, repeats < 1 (no sample to take the median of), a negative or non-finite
// arena, a --rows pattern that is not a regular expression or matches no row's label, --rows with --schemes.
// run_decode_bench calls it before any GPU work.
void check_bench_options(const BenchOptions& options);

// Every label a row of the main table can have (the kernel column), in the table's order.
std::vector<std::string> bench_row_labels();

// The NVTX range a row's timing runs in: its label with each '/' written as '|', since Nsight Compute's
// --nvtx-include reads '/' as the end of a push/pop range ("non-flush read nvfp4 (x over fp32 read)/").
std::string bench_row_range_name(const std::string& label);

// Prints the tables to stdout; returns 0.
int run_decode_bench(const BenchOptions& options);

}  // namespace replayssm::cuda
