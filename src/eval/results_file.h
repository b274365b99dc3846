// KL-sweep result files and sweep cell files: the HDF5 schema (written through io/hdf5.h).
//
// ---- Schema "replayssm-kl-sweep", version 2 (B books, N positions, K length buckets, J blocks) --
// /                         attributes (strings unless noted):
//     schema = "replayssm-kl-sweep", schema_version (int64) = 2, complete (int64) = 1,
//     toolkit_version, git_commit, host_isa (build_host_isa() of the builds that computed it),
//     device (the devices that computed it: "cpu", or "cuda: <GPU name> (sm_XY), compute fp32"),
//     created (UTC, ISO 8601), command_line,
//     model_description, model_hash, model_dir, text_dir, tokens_dir, tokenizer, tokenization,
//     reference_policy = "conv:fp32", n_positions (int64) = N, n_books (int64) = B,
//     toolkit_versions_used (JSON array: every build that computed a part of the file),
//     sweep (JSON: the identity of the sweep, compared when a sweep resumes, see cell_store.h),
//     bootstrap_base_block_length, bootstrap_resamples, bootstrap_seed (int64: kl_metrics.h's bootstrap)
// /bootstrap_block_length   int64 [K]: the block length each bucket is resampled in
// /config_order             string [C]: the configuration group names in sweep order
// /bucket_edges             int64 [K+1]: bucket k holds lengths (edges[k], edges[k+1]], where the
//                           length of 0-based position t is t + 1
// /books/name               string [B]   file name without .txt, sorted
// /books/source             string [B]   file name in text_dir
// /books/text_fnv1a64       string [B]   FNV-1a 64 of the stripped text (16 hex digits)
// /books/n_tokens           int64 [B]    tokens available in the whole book
// /books/tokens             int32 [B, N+1]  the ids fed (first N) and the next tokens (last N)
// /configs/<name>           one group per configuration; <name> = policy string with '/' -> '|'
//     attributes: policy (canonical string), config (JSON: policy, scheme, formats, roundings,
//                 window, seed, reference, n_positions, books), complete (int64) = 1,
//                 forward_seconds, kl_seconds (float64, summed over books), toolkit_version
//     kl                    float32 [B, N]  per-position KL (NaN/+Inf where non-finite),
//                           chunked (1, min(N, 65536)), shuffle + deflate 4
//     the statistics of stat_fields() (one table in results_file.cpp drives the writer, the
//     reader, the aggregate group and docs/KL_SWEEP.md's list, which a test compares with it):
//       per book [B], [B, K] (bucket_*), [B, 5] (percentiles: p50, p90, p99, p99.9, max, numpy
//       "linear", attribute levels), [B, K, 5] (bucket_percentiles), float64 or int64: means,
//       sums and counts, block-bootstrap standard errors (*_se), RMS delta-p, top-1, perplexity
//       ratio and both perplexities, per bucket and overall
//     block_count, block_kl_sum, block_top1_agree, block_target_count, block_logratio_sum
//                           [B, J]: the bootstrap's per-block sums, from which the SEs are computed
//     aggregate/            the same names without the book axis (and without blocks), pooled over
//                           every position of every book (bucket_mean = bucket_sum / bucket_count
//                           over all books; percentiles over all B*N stored values; SEs from the
//                           bootstrap over every book's blocks, books as strata), plus the spreads
//                           over books and over SR seeds (aggregate-only fields; attribute
//                           seed_group); scalars are scalar datasets
// Version 1 (no SEs, spreads, RMS delta-p, perplexities, per-bucket top-1 / percentiles or blocks;
// percentiles [B, 4] without p99.9) is still read: what it lacks reads as NaN.
// Non-finite values are counted, stored as computed and excluded from every mean.
//
// ---- Cell files "replayssm-kl-sweep-cell" (one (configuration, book) of an unfinished sweep) ----
// attributes: schema, sweep_id, policy, book, config_index, book_index, forward_seconds,
// kl_seconds, toolkit_version, host_isa, device, block_length, and the exact counters and sums of
// KlStats (positions, finite_positions, ..., top1_agree, delta_p_count, kl_sum, delta_p_sum,
// delta_p_sq_sum, logratio_sum, ref_nll_sum); datasets kl [N], edges [K+1], the bucket sums and
// counts [K], the block sums [J], percentiles [5], bucket_percentiles [K*5]. Merging cells is
// exact; the per-book SEs are recomputed from the stored blocks when a cell is read.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "eval/kl_metrics.h"

namespace replayssm::eval {

inline constexpr const char* kResultsSchema = "replayssm-kl-sweep";
inline constexpr int64_t kResultsSchemaVersion = 2;
inline constexpr int64_t kOldestResultsSchemaVersion = 1;  // read_results_summary still reads version 1
inline constexpr const char* kCellSchema = "replayssm-kl-sweep-cell";

// Group name of a configuration: the policy string with '/' (HDF5's path separator) -> '|'.
std::string config_group_name(const std::string& policy);

// One statistics dataset of a configuration group (see the schema above).
struct StatField {
  enum class Width { one, buckets, percentiles, bucket_percentiles };
  const char* name;
  bool integer;     // int64 (counts) or float64
  Width width;      // per book: [B] (one), [B, K] (buckets), [B, 5] (percentiles), [B, K, 5]
  const char* doc;
  bool aggregate_only;    // only in aggregate/ (spreads over books and seeds)
  int64_t since_version;  // the schema version that added it (absent from older files)
};
std::span<const StatField> stat_fields();

struct ResultsMetadata {
  std::string toolkit_version, git_commit, host_isa, device, created, command_line;
  std::string model_description, model_hash, model_dir;
  std::string text_dir, tokens_dir, tokenizer, tokenization;
  std::string reference_policy = "conv:fp32";
  std::string sweep_json;                      // identity of the sweep
  std::vector<std::string> toolkit_versions_used;
  int64_t n_positions = 0;
};

struct ResultsBook {
  std::string name, source, text_fnv1a64;
  int64_t n_tokens = 0;          // available in the book
  std::vector<int32_t> tokens;   // the n_positions + 1 used
};

struct ConfigAttributes {
  std::string policy, config_json, toolkit_version;
  double forward_seconds = 0.0, kl_seconds = 0.0;
};

// Builds a result file (in memory, io::h5::NewFile) and writes it atomically on commit(): root
// and books first, then each configuration with its per-book KL rows. Destroyed without
// commit(): nothing is written.
class ResultsWriter {
 public:
  ResultsWriter(std::string path, const ResultsMetadata& meta, const std::vector<ResultsBook>& books,
                const std::vector<int64_t>& edges);
  ~ResultsWriter();
  ResultsWriter(const ResultsWriter&) = delete;
  ResultsWriter& operator=(const ResultsWriter&) = delete;
  // kl_row(b) gives the N per-position values of book b (called once per book, in order).
  // `aggregate` must carry its percentiles (over all books' values).
  void add_config(const ConfigAttributes& attrs, const std::vector<KlStats>& per_book, const KlStats& aggregate,
                  const std::function<std::vector<float>(std::size_t)>& kl_row);
  // Root attributes known only after the cells are read.
  void set_toolkit_versions_used(const std::vector<std::string>& versions);
  void set_host_isa(const std::string& host_isa);
  void set_device(const std::string& device);
  void commit();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// What a sweep needs back from a result file (resume checks, the summary table, tests).
struct ConfigSummary {
  std::string group, policy, config_json;
  bool complete = false;
  KlStats aggregate;  // sums reconstructed from the stored means and counts
};
struct ResultsSummary {
  std::string schema;
  int64_t schema_version = 0;
  bool complete = false;
  ResultsMetadata meta;
  std::vector<std::string> book_names;
  std::vector<int64_t> edges;
  std::vector<ConfigSummary> configs;
};
// Throws std::runtime_error naming the file when it is not an HDF5 file, not a result file, of
// another schema version, or inconsistent (array sizes that do not match N, K or B).
ResultsSummary read_results_summary(const std::string& path);

// ---- sweep cells: one (configuration, book) result, the unit a sweep persists and resumes ------
struct CellRecord {
  std::string sweep_id;     // fingerprint of the sweep identity
  std::string policy, book;
  int64_t config_index = 0, book_index = 0;
  std::vector<float> kl;    // N values
  KlStats stats;            // exact (sums, counts, percentiles)
  double forward_seconds = 0.0, kl_seconds = 0.0;
  std::string toolkit_version, host_isa;  // host_isa empty: written by a build that did not record it
  std::string device;                     // empty: written before the device was recorded (all on the CPU)
};
void write_cell(const std::string& path, const CellRecord& cell);  // atomic
// Throws naming the file when it is not a cell file or its arrays are inconsistent.
CellRecord read_cell(const std::string& path);

}  // namespace replayssm::eval
