// KL-sweep result files (HDF5, written with the C API through the small RAII layer in io::h5).
//
// ---- Schema "replayssm-kl-sweep", version 1 (B books, N positions, K length buckets) -----------
// /                         attributes (strings unless noted):
//     schema = "replayssm-kl-sweep", schema_version (int64) = 1, complete (int64) = 1,
//     toolkit_version, git_commit, created (UTC, ISO 8601), command_line,
//     model_description, model_hash, model_dir, text_dir, tokens_dir, tokenizer, tokenization,
//     reference_policy = "conv:fp32", n_positions (int64) = N, n_books (int64) = B,
//     toolkit_versions_used (JSON array: every build that computed a part of the file),
//     sweep (JSON: the identity of the sweep, compared when a sweep resumes, see kl_sweep.h)
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
//     bucket_mean           float64 [B, K]  mean KL of the finite positions (NaN if none)
//     bucket_sum            float64 [B, K]
//     bucket_count          int64 [B, K]    finite positions per bucket
//     mean_kl, top1, delta_p  float64 [B]   over finite positions: mean KL, fraction of positions
//                           whose argmax agrees with the reference, mean of p_cfg - p_ref of the
//                           true next token
//     percentiles           float64 [B, 4]  p50, p90, p99, max of the finite stored kl values
//                           (numpy "linear"); attribute levels = [50, 90, 99, 100]
//     positions, finite_positions, nonfinite_positions, ref_nonfinite_positions,
//     nonfinite_values      int64 [B]
//     aggregate/            the same names without the book axis, pooled over every position of
//                           every book (bucket_mean = bucket_sum / bucket_count over all books;
//                           percentiles over all B*N stored values); scalars are scalar datasets
// Non-finite values are counted, stored as computed and excluded from every mean.
#pragma once
#include <hdf5.h>

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "eval/kl_metrics.h"
#include "io/atomic_file.h"

namespace replayssm::io {

// ---- RAII over the HDF5 C API ----------------------------------------------------------------
namespace h5 {

// Owns one HDF5 identifier; closes it with the matching H5*close.
class Handle {
 public:
  Handle() = default;
  Handle(hid_t id, herr_t (*close)(hid_t)) : id_(id), close_(close) {}
  Handle(Handle&& o) noexcept : id_(o.id_), close_(o.close_) { o.id_ = H5I_INVALID_HID; }
  Handle& operator=(Handle&& o) noexcept;
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  ~Handle() { reset(); }
  hid_t get() const { return id_; }
  operator hid_t() const { return id_; }
  void reset();

 private:
  hid_t id_ = H5I_INVALID_HID;
  herr_t (*close_)(hid_t) = nullptr;
};

// Errors are std::runtime_error "WHAT: <HDF5 error stack>"; HDF5's own printing is switched off.
Handle create_file(const std::string& path);  // truncates
Handle open_file(const std::string& path);    // read-only
Handle create_group(hid_t loc, const std::string& name);
Handle open_group(hid_t loc, const std::string& name);
bool has_link(hid_t loc, const std::string& name);
bool has_attr(hid_t obj, const std::string& name);

void write_attr(hid_t obj, const std::string& name, const std::string& value);  // variable-length UTF-8
void write_attr(hid_t obj, const std::string& name, int64_t value);
void write_attr(hid_t obj, const std::string& name, double value);
void write_attr(hid_t obj, const std::string& name, std::span<const double> values);
std::string read_attr_string(hid_t obj, const std::string& name);
int64_t read_attr_int(hid_t obj, const std::string& name);
double read_attr_double(hid_t obj, const std::string& name);

// Element types: float, double, int32_t, int64_t. dims empty: a scalar dataset. Compressed
// datasets are chunked (chunk dims given, or the whole extent), shuffled and deflated.
template <class T>
void write_dataset(hid_t loc, const std::string& name, const std::vector<hsize_t>& dims, const T* data,
                   const std::vector<hsize_t>& chunk = {});
template <class T>
std::vector<T> read_dataset(hid_t loc, const std::string& name, std::vector<hsize_t>* dims = nullptr);
void write_strings(hid_t loc, const std::string& name, const std::vector<std::string>& values);
std::vector<std::string> read_strings(hid_t loc, const std::string& name);

// A chunked, compressed float32 dataset [rows, cols] written one row at a time.
class RowWriter {
 public:
  RowWriter(hid_t loc, const std::string& name, hsize_t rows, hsize_t cols);
  void write_row(hsize_t row, std::span<const float> values);

 private:
  Handle dataset_, file_space_;
  hsize_t rows_, cols_;
};
// Reads row `row` of a 2-D float32 dataset.
std::vector<float> read_row(hid_t loc, const std::string& name, hsize_t row);

}  // namespace h5

// ---- result files ----------------------------------------------------------------------------
inline constexpr const char* kResultsSchema = "replayssm-kl-sweep";
inline constexpr int64_t kResultsSchemaVersion = 1;

// Group name of a configuration: the policy string with '/' (HDF5's path separator) -> '|'.
std::string config_group_name(const std::string& policy);

struct ResultsMetadata {
  std::string toolkit_version, git_commit, created, command_line;
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

// Writes a result file to temp_path_for(path) and commits it (atomic): root and books first, then
// each configuration with its per-book KL rows; ~ResultsWriter without commit() removes the
// temporary file.
class ResultsWriter {
 public:
  ResultsWriter(std::string path, const ResultsMetadata& meta, const std::vector<ResultsBook>& books,
                const std::vector<int64_t>& edges);
  ~ResultsWriter();
  ResultsWriter(const ResultsWriter&) = delete;
  ResultsWriter& operator=(const ResultsWriter&) = delete;
  // kl_row(b) gives the N per-position values of book b (called once per book, in order).
  // `aggregate` must carry its percentiles (over all books' values).
  void add_config(const ConfigAttributes& attrs, const std::vector<eval::KlStats>& per_book,
                  const eval::KlStats& aggregate, const std::function<std::vector<float>(std::size_t)>& kl_row);
  // Rewrites the root attribute toolkit_versions_used (known only after the cells are read).
  void set_toolkit_versions_used(const std::vector<std::string>& versions);
  void commit();
  const std::string& temp_path() const { return tmp_; }

 private:
  std::string path_, tmp_;
  h5::Handle file_;
  std::size_t n_books_;
  int64_t n_;
  std::vector<std::string> config_names_;
  bool committed_ = false;
};

// What a sweep needs back from a result file (resume checks, the summary table, tests).
struct ConfigSummary {
  std::string group, policy, config_json;
  bool complete = false;
  eval::KlStats aggregate;  // sums reconstructed from the stored means and counts
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
// Throws std::runtime_error naming the file when it is not an HDF5 file or not a result file.
ResultsSummary read_results_summary(const std::string& path);

// ---- sweep cells: one (configuration, book) result, the unit a sweep persists and resumes ------
struct CellRecord {
  std::string sweep_id;     // fingerprint of the sweep identity
  std::string policy, book;
  int64_t config_index = 0, book_index = 0;
  std::vector<float> kl;    // N values
  eval::KlStats stats;      // exact (sums, counts, percentiles)
  double forward_seconds = 0.0, kl_seconds = 0.0;
  std::string toolkit_version;
};
void write_cell(const std::string& path, const CellRecord& cell);  // atomic
CellRecord read_cell(const std::string& path);

}  // namespace replayssm::io
