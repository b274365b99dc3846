#include "eval/results_file.h"

#include <array>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <variant>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "io/hdf5.h"

namespace replayssm::eval {

namespace h5 = io::h5;

std::string config_group_name(const std::string& policy) {
  std::string s = policy;
  for (char& c : s)
    if (c == '/') c = '|';
  if (s.empty() || s == ".") s = "_" + s;
  return s;
}

// ---- the statistics table ------------------------------------------------------------------------
namespace {

using Column = std::variant<std::vector<double>, std::vector<int64_t>>;
using W = StatField::Width;

// A statistics dataset and how it is computed from, and restored into, KlStats.
struct FieldCodec {
  StatField field;
  Column (*get)(const KlStats&);
  // Sets the members the stored values determine; nullptr for derived values (bucket_mean).
  // Integer fields are restored first, so the means can be turned back into sums.
  void (*restore)(KlStats&, const Column&);
};

const std::vector<double>& f64(const Column& c) { return std::get<std::vector<double>>(c); }
const std::vector<int64_t>& i64(const Column& c) { return std::get<std::vector<int64_t>>(c); }
double finite_count(const KlStats& s) { return static_cast<double>(s.finite_positions); }
// A stored mean (NaN: no value) back into its sum over `count` values: 0 where there were none.
double sum_of(double mean, int64_t count) { return count && std::isfinite(mean) ? mean * static_cast<double>(count) : 0.0; }
double log_or_nan(double v) { return std::isfinite(v) ? std::log(v) : std::numeric_limits<double>::quiet_NaN(); }
Column one_value(double v) { return std::vector<double>{v}; }
std::vector<double> flat_percentiles(const std::vector<Percentiles>& p) {
  std::vector<double> v;
  for (const Percentiles& x : p) v.insert(v.end(), x.value.begin(), x.value.end());
  return v;
}

constexpr int64_t v1 = 1, v2 = 2;
constexpr bool per_book = false, aggregate_only = true;

// Written in this order (the groups track creation order).
const std::array<FieldCodec, 31> kFields = {{
    {{"bucket_mean", false, W::buckets, "mean KL of the finite positions per length bucket (NaN if none)", per_book, v1},
     [](const KlStats& s) -> Column { return s.bucket_mean(); }, nullptr},
    {{"bucket_sum", false, W::buckets, "sum of the finite KL per length bucket", per_book, v1},
     [](const KlStats& s) -> Column { return s.bucket_sum; }, [](KlStats& s, const Column& v) { s.bucket_sum = f64(v); }},
    {{"bucket_count", true, W::buckets, "finite positions per length bucket", per_book, v1},
     [](const KlStats& s) -> Column { return s.bucket_count; },
     [](KlStats& s, const Column& v) { s.bucket_count = i64(v); }},
    {{"bucket_mean_se", false, W::buckets, "standard error of bucket_mean, block bootstrap over positions", per_book, v2},
     [](const KlStats& s) -> Column { return s.se.bucket_mean; }, [](KlStats& s, const Column& v) { s.se.bucket_mean = f64(v); }},
    {{"bucket_top1", false, W::buckets, "top-1 agreement per length bucket", per_book, v2},
     [](const KlStats& s) -> Column { return s.bucket_top1(); },
     [](KlStats& s, const Column& v) {
       for (std::size_t k = 0; k < s.bucket_top1_agree.size(); ++k)
         s.bucket_top1_agree[k] = std::llround(sum_of(f64(v)[k], s.bucket_count[k]));
     }},
    {{"bucket_top1_se", false, W::buckets, "standard error of bucket_top1, block bootstrap", per_book, v2},
     [](const KlStats& s) -> Column { return s.se.bucket_top1; }, [](KlStats& s, const Column& v) { s.se.bucket_top1 = f64(v); }},
    {{"bucket_rms_delta_p", false, W::buckets, "sqrt(mean delta_p^2) per length bucket", per_book, v2},
     [](const KlStats& s) -> Column { return s.bucket_rms_delta_p(); },
     [](KlStats& s, const Column& v) {
       for (std::size_t k = 0; k < s.bucket_delta_p_sq_sum.size(); ++k)
         s.bucket_delta_p_sq_sum[k] = sum_of(f64(v)[k] * f64(v)[k], s.bucket_target_count[k]);
     }},
    {{"bucket_target_count", true, W::buckets, "finite positions with a known next token per length bucket", per_book, v2},
     [](const KlStats& s) -> Column { return s.bucket_target_count; },
     [](KlStats& s, const Column& v) { s.bucket_target_count = i64(v); }},
    {{"bucket_ppl_ratio", false, W::buckets, "perplexity ratio PPL(cfg) / PPL(ref) per length bucket", per_book, v2},
     [](const KlStats& s) -> Column { return s.bucket_ppl_ratio(); },
     [](KlStats& s, const Column& v) {
       for (std::size_t k = 0; k < s.bucket_logratio_sum.size(); ++k)
         s.bucket_logratio_sum[k] = sum_of(log_or_nan(f64(v)[k]), s.bucket_target_count[k]);
     }},
    {{"bucket_ppl_ratio_se", false, W::buckets, "standard error of bucket_ppl_ratio, block bootstrap", per_book, v2},
     [](const KlStats& s) -> Column { return s.se.bucket_ppl_ratio; },
     [](KlStats& s, const Column& v) { s.se.bucket_ppl_ratio = f64(v); }},
    {{"bucket_percentiles", false, W::bucket_percentiles,
      "p50, p90, p99, p99.9 and max of the finite stored KL values per length bucket; attribute levels", per_book, v2},
     [](const KlStats& s) -> Column { return flat_percentiles(s.bucket_pct); },
     [](KlStats& s, const Column& v) {
       const std::size_t L = Percentiles::kLevels.size();
       for (std::size_t k = 0; k < s.bucket_pct.size(); ++k)
         std::copy_n(f64(v).begin() + static_cast<std::ptrdiff_t>(k * L), L, s.bucket_pct[k].value.begin());
     }},
    {{"mean_kl", false, W::one, "mean KL over the finite positions", per_book, v1},
     [](const KlStats& s) -> Column { return one_value(s.mean_kl()); },
     [](KlStats& s, const Column& v) { s.kl_sum = s.finite_positions ? f64(v)[0] * finite_count(s) : 0.0; }},
    {{"mean_kl_se", false, W::one, "standard error of mean_kl, block bootstrap over positions", per_book, v2},
     [](const KlStats& s) -> Column { return one_value(s.se.mean_kl); }, [](KlStats& s, const Column& v) { s.se.mean_kl = f64(v)[0]; }},
    {{"top1", false, W::one, "fraction of the finite positions whose argmax agrees with the reference", per_book, v1},
     [](const KlStats& s) -> Column { return one_value(s.top1()); },
     [](KlStats& s, const Column& v) {
       s.top1_agree = s.finite_positions ? static_cast<int64_t>(std::llround(f64(v)[0] * finite_count(s))) : 0;
     }},
    {{"top1_se", false, W::one, "standard error of top1, block bootstrap", per_book, v2},
     [](const KlStats& s) -> Column { return one_value(s.se.top1); }, [](KlStats& s, const Column& v) { s.se.top1 = f64(v)[0]; }},
    {{"delta_p", false, W::one, "mean of p_cfg - p_ref of the true next token over the finite positions", per_book, v1},
     [](const KlStats& s) -> Column { return one_value(s.mean_delta_p()); },
     [](KlStats& s, const Column& v) {
       // Version 1 stored no target count: every position of a sweep has its next token.
       int64_t targets = 0;
       for (int64_t m : s.bucket_target_count) targets += m;
       s.delta_p_count = targets ? targets : s.finite_positions;
       s.delta_p_sum = sum_of(f64(v)[0], s.delta_p_count);
     }},
    {{"rms_delta_p", false, W::one, "sqrt(mean delta_p^2) over the finite positions", per_book, v2},
     [](const KlStats& s) -> Column { return one_value(s.rms_delta_p()); },
     [](KlStats& s, const Column& v) { s.delta_p_sq_sum = sum_of(f64(v)[0] * f64(v)[0], s.delta_p_count); }},
    {{"ppl_ratio", false, W::one,
      "PPL(cfg) / PPL(ref) = exp(mean(-log p_cfg(target)) - mean(-log p_ref(target))) over the finite positions",
      per_book, v2},
     [](const KlStats& s) -> Column { return one_value(s.ppl_ratio()); },
     [](KlStats& s, const Column& v) { s.logratio_sum = sum_of(log_or_nan(f64(v)[0]), s.delta_p_count); }},
    {{"ppl_ratio_se", false, W::one, "standard error of ppl_ratio, block bootstrap", per_book, v2},
     [](const KlStats& s) -> Column { return one_value(s.se.ppl_ratio); }, [](KlStats& s, const Column& v) { s.se.ppl_ratio = f64(v)[0]; }},
    {{"ppl", false, W::one, "the configuration's perplexity exp(mean(-log p_cfg(target)))", per_book, v2},
     [](const KlStats& s) -> Column { return one_value(s.ppl()); }, nullptr},
    {{"ref_ppl", false, W::one, "the reference's perplexity exp(mean(-log p_ref(target))) over the same positions",
      per_book, v2},
     [](const KlStats& s) -> Column { return one_value(s.ref_ppl()); },
     [](KlStats& s, const Column& v) { s.ref_nll_sum = sum_of(log_or_nan(f64(v)[0]), s.delta_p_count); }},
    {{"percentiles", false, W::percentiles,
      "p50, p90, p99, p99.9 and max of the finite stored KL values (numpy \"linear\"); attribute levels", per_book, v1},
     [](const KlStats& s) -> Column { return std::vector<double>(s.pct.value.begin(), s.pct.value.end()); },
     [](KlStats& s, const Column& v) {
       if (f64(v).size() == 4) {  // version 1: levels [50, 90, 99, 100]
         s.pct.value = {f64(v)[0], f64(v)[1], f64(v)[2], std::numeric_limits<double>::quiet_NaN(), f64(v)[3]};
         return;
       }
       std::copy(f64(v).begin(), f64(v).end(), s.pct.value.begin());
     }},
    {{"positions", true, W::one, "positions", per_book, v1},
     [](const KlStats& s) -> Column { return std::vector<int64_t>{s.positions}; },
     [](KlStats& s, const Column& v) { s.positions = i64(v)[0]; }},
    {{"finite_positions", true, W::one, "positions in the statistics", per_book, v1},
     [](const KlStats& s) -> Column { return std::vector<int64_t>{s.finite_positions}; },
     [](KlStats& s, const Column& v) { s.finite_positions = i64(v)[0]; }},
    {{"nonfinite_positions", true, W::one, "positions left out (configuration or reference non-finite)", per_book, v1},
     [](const KlStats& s) -> Column { return std::vector<int64_t>{s.nonfinite_positions}; },
     [](KlStats& s, const Column& v) { s.nonfinite_positions = i64(v)[0]; }},
    {{"ref_nonfinite_positions", true, W::one, "of which the reference row was non-finite", per_book, v1},
     [](const KlStats& s) -> Column { return std::vector<int64_t>{s.ref_nonfinite_positions}; },
     [](KlStats& s, const Column& v) { s.ref_nonfinite_positions = i64(v)[0]; }},
    {{"nonfinite_values", true, W::one, "NaN/Inf entries in the configuration's log-probability rows", per_book, v1},
     [](const KlStats& s) -> Column { return std::vector<int64_t>{s.nonfinite_values}; },
     [](KlStats& s, const Column& v) { s.nonfinite_values = i64(v)[0]; }},
    {{"mean_kl_book_se", false, W::one, "sd of the per-book mean_kl / sqrt(B): the spread over books (B >= 2)",
      aggregate_only, v2},
     [](const KlStats& s) -> Column { return one_value(s.mean_kl_book_se); },
     [](KlStats& s, const Column& v) { s.mean_kl_book_se = f64(v)[0]; }},
    {{"bucket_mean_book_se", false, W::buckets, "the same per length bucket", aggregate_only, v2},
     [](const KlStats& s) -> Column { return s.bucket_mean_book_se; },
     [](KlStats& s, const Column& v) { s.bucket_mean_book_se = f64(v); }},
    {{"mean_kl_seed_se", false, W::one,
      "sd of mean_kl over the SR seeds of this policy / sqrt(S) (attribute seed_group: the S configurations; NaN "
      "when the sweep ran one seed)",
      aggregate_only, v2},
     [](const KlStats& s) -> Column { return one_value(s.mean_kl_seed_se); },
     [](KlStats& s, const Column& v) { s.mean_kl_seed_se = f64(v)[0]; }},
    {{"bucket_mean_seed_se", false, W::buckets, "the same per length bucket", aggregate_only, v2},
     [](const KlStats& s) -> Column { return s.bucket_mean_seed_se; },
     [](KlStats& s, const Column& v) { s.bucket_mean_seed_se = f64(v); }},
}};

const std::array<StatField, kFields.size()> kPublicFields = [] {
  std::array<StatField, kFields.size()> a{};
  for (std::size_t i = 0; i < kFields.size(); ++i) a[i] = kFields[i].field;
  return a;
}();

std::size_t field_width(const StatField& f, std::size_t K) {
  switch (f.width) {
    case W::one: return 1;
    case W::buckets: return K;
    case W::percentiles: return Percentiles::kLevels.size();
    case W::bucket_percentiles: return K * Percentiles::kLevels.size();
  }
  return 0;
}

// Writes one field: dims {B} / {B, width} per book, {} / {width} for the aggregate (books = 0).
void write_column(hid_t g, const FieldCodec& f, const Column& values, std::size_t books, std::size_t K) {
  std::vector<hsize_t> dims;
  if (books > 0) dims.push_back(books);
  if (f.field.width == W::buckets || f.field.width == W::bucket_percentiles) dims.push_back(K);
  if (f.field.width == W::percentiles || f.field.width == W::bucket_percentiles)
    dims.push_back(Percentiles::kLevels.size());
  std::visit([&](const auto& v) { h5::write_dataset(g, f.field.name, dims, v.data()); }, values);
  if (f.field.width == W::percentiles || f.field.width == W::bucket_percentiles) {
    const h5::Handle d = h5::open_dataset(g, f.field.name);
    const std::vector<double> levels(Percentiles::kLevels.begin(), Percentiles::kLevels.end());
    h5::write_attr(d, "levels", std::span<const double>(levels));
  }
  // Named dimensions (the root's scales, see ResultsWriter): book, then bucket and/or percentile.
  unsigned dim = 0;
  if (books > 0) h5::attach_dimension_scale(g, f.field.name, "book", dim++);
  if (f.field.width == W::buckets || f.field.width == W::bucket_percentiles)
    h5::attach_dimension_scale(g, f.field.name, "bucket", dim++);
  if (f.field.width == W::percentiles || f.field.width == W::bucket_percentiles)
    h5::attach_dimension_scale(g, f.field.name, "percentile", dim);
}

// The values of `f` for `s`, checked against the width the edges give (K buckets).
Column field_values(const FieldCodec& f, const KlStats& s, std::size_t K, const std::string& whose) {
  Column v = f.get(s);
  const std::size_t n = std::visit([](const auto& x) { return x.size(); }, v);
  if (n != field_width(f.field, K))
    throw std::invalid_argument(fmt::format("ResultsWriter: {} of {} has {} values, expected {} (K = {})", f.field.name,
                                            whose, n, field_width(f.field, K), K));
  return v;
}

// The per-book arrays [B, ...] of every field, and the bootstrap's block sums [B, blocks].
void write_per_book(hid_t g, const std::vector<KlStats>& per_book, std::size_t K) {
  for (const FieldCodec& f : kFields) {
    if (f.field.aggregate_only) continue;
    Column all = f.field.integer ? Column(std::vector<int64_t>()) : Column(std::vector<double>());
    for (std::size_t b = 0; b < per_book.size(); ++b) {
      const Column one = field_values(f, per_book[b], K, fmt::format("book {}", b));
      std::visit(
          [&](auto& dst) {
            const auto& src = std::get<std::decay_t<decltype(dst)>>(one);
            dst.insert(dst.end(), src.begin(), src.end());
          },
          all);
    }
    write_column(g, f, all, per_book.size(), K);
  }
  if (per_book.empty()) return;
  const std::size_t n_blocks = per_book.front().blocks.size();
  const auto rows = [&](auto member) {
    std::vector<std::decay_t<decltype((per_book.front().blocks.*member)[0])>> v;
    for (const KlStats& s : per_book) {
      const auto& x = s.blocks.*member;
      if (x.size() != n_blocks)
        throw std::invalid_argument(fmt::format("ResultsWriter: books with {} and {} bootstrap blocks", n_blocks, x.size()));
      v.insert(v.end(), x.begin(), x.end());
    }
    return v;
  };
  const std::vector<hsize_t> dims{per_book.size(), n_blocks};
  const std::vector<hsize_t> chunk{1, std::max<hsize_t>(1, n_blocks)};
  const auto put = [&](const char* name, const auto& v) {
    h5::write_dataset(g, name, dims, v.data(), chunk);
    h5::attach_dimension_scale(g, name, "book", 0);
    h5::attach_dimension_scale(g, name, "block", 1);
  };
  put("block_count", rows(&BlockSums::count));
  put("block_kl_sum", rows(&BlockSums::kl_sum));
  put("block_top1_agree", rows(&BlockSums::top1_agree));
  put("block_target_count", rows(&BlockSums::target_count));
  put("block_logratio_sum", rows(&BlockSums::logratio_sum));
}

void write_aggregate(hid_t g, const KlStats& s, std::size_t K) {
  for (const FieldCodec& f : kFields) write_column(g, f, field_values(f, s, K, "the aggregate"), 0, K);
  if (!s.seed_group.empty()) h5::write_attr(g, "seed_group", nlohmann::json(s.seed_group).dump());
}

// Restores the KlStats an aggregate group describes (sums from the stored means and counts).
// A version-1 file has none of the fields added in version 2: they stay NaN (zero sums).
KlStats read_aggregate(hid_t g, const std::vector<int64_t>& edges, int64_t version) {
  KlStats s(edges);
  const std::size_t K = edges.size() - 1;
  for (bool integers : {true, false})
    for (const FieldCodec& f : kFields) {
      if (f.field.integer != integers || !f.restore || f.field.since_version > version) continue;
      Column v = integers ? Column(h5::read_dataset<int64_t>(g, f.field.name))
                          : Column(h5::read_dataset<double>(g, f.field.name));
      const std::size_t n = std::visit([](const auto& x) { return x.size(); }, v);
      const std::size_t want = version == 1 && f.field.width == W::percentiles ? 4 : field_width(f.field, K);
      if (n != want)
        throw std::runtime_error(fmt::format("aggregate/{} holds {} values, expected {}", f.field.name, n, want));
      f.restore(s, v);
    }
  if (version < 2) {  // sums version 1 did not store: unknown, not zero
    const double nan = std::numeric_limits<double>::quiet_NaN();
    s.delta_p_sq_sum = s.logratio_sum = s.ref_nll_sum = nan;
    std::fill(s.bucket_delta_p_sq_sum.begin(), s.bucket_delta_p_sq_sum.end(), nan);
    std::fill(s.bucket_logratio_sum.begin(), s.bucket_logratio_sum.end(), nan);
    s.bucket_top1_known = false;
  }
  if (h5::has_attr(g, "seed_group"))
    s.seed_group = nlohmann::json::parse(h5::read_attr_string(g, "seed_group")).get<std::vector<std::string>>();
  return s;
}

// The root's string attributes and the metadata members they hold.
constexpr std::array<std::pair<const char*, std::string ResultsMetadata::*>, 15> kRootStrings = {{
    {"toolkit_version", &ResultsMetadata::toolkit_version},
    {"git_commit", &ResultsMetadata::git_commit},
    {"host_isa", &ResultsMetadata::host_isa},
    {"device", &ResultsMetadata::device},
    {"created", &ResultsMetadata::created},
    {"command_line", &ResultsMetadata::command_line},
    {"model_description", &ResultsMetadata::model_description},
    {"model_hash", &ResultsMetadata::model_hash},
    {"model_dir", &ResultsMetadata::model_dir},
    {"text_dir", &ResultsMetadata::text_dir},
    {"tokens_dir", &ResultsMetadata::tokens_dir},
    {"tokenizer", &ResultsMetadata::tokenizer},
    {"tokenization", &ResultsMetadata::tokenization},
    {"reference_policy", &ResultsMetadata::reference_policy},
    {"sweep", &ResultsMetadata::sweep_json},
}};

std::string attr_or_empty(hid_t obj, const std::string& name) {
  return h5::has_attr(obj, name) ? h5::read_attr_string(obj, name) : std::string();
}

}  // namespace

std::span<const StatField> stat_fields() { return kPublicFields; }

// ---- result files --------------------------------------------------------------------------------

struct ResultsWriter::Impl {
  explicit Impl(std::string path) : file(std::move(path)) {}
  h5::NewFile file;
  std::size_t n_books = 0, k = 0;
  int64_t n = 0;
  std::vector<std::string> config_names;
};

ResultsWriter::ResultsWriter(std::string path, const ResultsMetadata& meta, const std::vector<ResultsBook>& books,
                             const std::vector<int64_t>& edges)
    : impl_(std::make_unique<Impl>(std::move(path))) {
  impl_->n_books = books.size();
  impl_->n = meta.n_positions;
  impl_->k = edges.empty() ? 0 : edges.size() - 1;
  const hid_t f = impl_->file;
  h5::write_attr(f, "schema", std::string(kResultsSchema));
  h5::write_attr(f, "schema_version", kResultsSchemaVersion);
  for (const auto& [name, member] : kRootStrings) h5::write_attr(f, name, meta.*member);
  h5::write_attr(f, "n_positions", meta.n_positions);
  h5::write_attr(f, "n_books", static_cast<int64_t>(books.size()));
  set_toolkit_versions_used(meta.toolkit_versions_used);

  h5::write_dataset(f, "bucket_edges", {edges.size()}, edges.data());
  h5::Handle g = h5::create_group(f, "books");
  std::vector<std::string> names, sources, hashes;
  std::vector<int64_t> n_tokens;
  const auto width = static_cast<std::size_t>(meta.n_positions + 1);
  std::vector<int32_t> tokens(books.size() * width);
  for (std::size_t b = 0; b < books.size(); ++b) {
    names.push_back(books[b].name);
    sources.push_back(books[b].source);
    hashes.push_back(books[b].text_fnv1a64);
    n_tokens.push_back(books[b].n_tokens);
    if (books[b].tokens.size() != width)
      throw std::invalid_argument(fmt::format("ResultsWriter: book {} has {} tokens, expected N + 1 = {}", books[b].name,
                                              books[b].tokens.size(), width));
    std::copy(books[b].tokens.begin(), books[b].tokens.end(), tokens.begin() + static_cast<std::ptrdiff_t>(b * width));
  }
  h5::write_strings(g, "name", names);
  h5::write_strings(g, "source", sources);
  h5::write_strings(g, "text_fnv1a64", hashes);
  h5::write_dataset(g, "n_tokens", {n_tokens.size()}, n_tokens.data());
  h5::write_dataset(g, "tokens", {books.size(), width}, tokens.data(), {1, 65536});
  h5::create_group(f, "configs");

  // Dimension scales: the coordinates of the configurations' arrays (kl [book, position], per-book
  // statistics [book(, bucket | percentile)], aggregates [bucket | percentile]), so that
  // xarray.open_dataset(file, engine="h5netcdf", group="configs/NAME") names them.
  std::vector<int64_t> positions(static_cast<std::size_t>(meta.n_positions));
  for (std::size_t t = 0; t < positions.size(); ++t) positions[t] = static_cast<int64_t>(t);
  h5::write_dataset(f, "position", {positions.size()}, positions.data(),
                    {std::max<hsize_t>(1, std::min<hsize_t>(positions.size(), 65536))});
  const std::vector<int64_t> bucket_ends(edges.empty() ? edges.begin() : edges.begin() + 1, edges.end());
  h5::write_dataset(f, "bucket", {bucket_ends.size()}, bucket_ends.data());
  h5::write_strings(f, "book", names);
  const std::vector<double> levels(Percentiles::kLevels.begin(), Percentiles::kLevels.end());
  h5::write_dataset(f, "percentile", {levels.size()}, levels.data());
  h5::make_dimension_scale(f, "position", "position");
  h5::make_dimension_scale(f, "bucket", "bucket");
  h5::make_dimension_scale(f, "book", "book");
  h5::make_dimension_scale(f, "percentile", "percentile");
  // The bootstrap's base blocks [j b, (j + 1) b): the scale holds each block's first position; and
  // the block length each bucket is resampled in (runs of base blocks).
  const int64_t block = bootstrap_block_length(edges);
  std::vector<int64_t> block_starts;
  for (int64_t t = 0; t < meta.n_positions; t += block) block_starts.push_back(t);
  h5::write_dataset(f, "block", {block_starts.size()}, block_starts.data());
  h5::make_dimension_scale(f, "block", "block");
  const std::vector<int64_t> lengths = bootstrap_block_lengths(edges);
  h5::write_dataset(f, "bootstrap_block_length", {lengths.size()}, lengths.data());
  h5::attach_dimension_scale(f, "bootstrap_block_length", "bucket", 0);
  h5::write_attr(f, "bootstrap_base_block_length", block);
  h5::write_attr(f, "bootstrap_resamples", static_cast<int64_t>(kBootstrapResamples));
  h5::write_attr(f, "bootstrap_seed", static_cast<int64_t>(kBootstrapSeed));
}

ResultsWriter::~ResultsWriter() = default;

void ResultsWriter::add_config(const ConfigAttributes& attrs, const std::vector<KlStats>& per_book,
                               const KlStats& aggregate, const std::function<std::vector<float>(std::size_t)>& kl_row) {
  if (per_book.size() != impl_->n_books)
    throw std::invalid_argument(fmt::format("ResultsWriter::add_config {}: {} per-book statistics for {} books",
                                            attrs.policy, per_book.size(), impl_->n_books));
  h5::Handle configs = h5::open_group(impl_->file, "configs");
  const std::string name = config_group_name(attrs.policy);
  h5::Handle g = h5::create_group(configs, name);
  impl_->config_names.push_back(name);
  h5::write_attr(g, "policy", attrs.policy);
  h5::write_attr(g, "config", attrs.config_json);
  h5::write_attr(g, "forward_seconds", attrs.forward_seconds);
  h5::write_attr(g, "kl_seconds", attrs.kl_seconds);
  h5::write_attr(g, "toolkit_version", attrs.toolkit_version);
  {
    h5::RowWriter w(g, "kl", impl_->n_books, static_cast<hsize_t>(impl_->n));
    for (std::size_t b = 0; b < impl_->n_books; ++b) w.write_row(b, kl_row(b));
  }
  h5::attach_dimension_scale(g, "kl", "book", 0);
  h5::attach_dimension_scale(g, "kl", "position", 1);
  write_per_book(g, per_book, impl_->k);
  h5::Handle a = h5::create_group(g, "aggregate");
  write_aggregate(a, aggregate, impl_->k);
  h5::write_attr(g, "complete", int64_t{1});
}

void ResultsWriter::set_toolkit_versions_used(const std::vector<std::string>& versions) {
  h5::write_attr(impl_->file, "toolkit_versions_used", nlohmann::json(versions).dump());
}

void ResultsWriter::set_host_isa(const std::string& host_isa) { h5::write_attr(impl_->file, "host_isa", host_isa); }

void ResultsWriter::set_device(const std::string& device) { h5::write_attr(impl_->file, "device", device); }

void ResultsWriter::commit() {
  h5::write_strings(impl_->file, "config_order", impl_->config_names);
  h5::write_attr(impl_->file, "complete", int64_t{1});
  impl_->file.commit();
}

namespace {

ResultsSummary read_summary(hid_t f, const std::string& path) {
  ResultsSummary s;
  if (!h5::has_attr(f, "schema"))
    throw std::runtime_error(fmt::format("{}: not a replayssm kl-sweep result file (no 'schema' attribute)", path));
  s.schema = h5::read_attr_string(f, "schema");
  if (s.schema != kResultsSchema)
    throw std::runtime_error(fmt::format("{}: not a replayssm kl-sweep result file (schema '{}', expected '{}')", path,
                                         s.schema, kResultsSchema));
  s.schema_version = h5::read_attr_int(f, "schema_version");
  if (s.schema_version < kOldestResultsSchemaVersion || s.schema_version > kResultsSchemaVersion)
    throw std::runtime_error(fmt::format("{}: result schema version {} (this build reads {} to {})", path,
                                         s.schema_version, kOldestResultsSchemaVersion, kResultsSchemaVersion));
  s.complete = h5::has_attr(f, "complete") && h5::read_attr_int(f, "complete") == 1;
  ResultsMetadata& m = s.meta;
  // Absent string attributes read as empty (host_isa: files written before it was recorded).
  for (const auto& [name, member] : kRootStrings) m.*member = attr_or_empty(f, name);
  m.n_positions = h5::read_attr_int(f, "n_positions");
  s.edges = h5::read_dataset<int64_t>(f, "bucket_edges");
  // The edges define K and N for everything below: refuse what no writer produces.
  bool edges_ok = s.edges.size() >= 2 && s.edges.front() == 0 && s.edges.back() == m.n_positions;
  for (std::size_t k = 1; edges_ok && k < s.edges.size(); ++k) edges_ok = s.edges[k] > s.edges[k - 1];
  if (!edges_ok)
    throw std::runtime_error(fmt::format("{}: bucket_edges {} do not rise from 0 to n_positions = {}", path,
                                         nlohmann::json(s.edges).dump(), m.n_positions));
  {
    h5::Handle b = h5::open_group(f, "books");
    s.book_names = h5::read_strings(b, "name");
  }
  if (h5::has_attr(f, "n_books") && h5::read_attr_int(f, "n_books") != static_cast<int64_t>(s.book_names.size()))
    throw std::runtime_error(fmt::format("{}: n_books = {} but books/name lists {}", path, h5::read_attr_int(f, "n_books"),
                                         s.book_names.size()));
  h5::Handle configs = h5::open_group(f, "configs");
  // The sweep order; every group the file holds is listed (the writer adds them together).
  const std::vector<std::string> names = h5::read_strings(f, "config_order");
  for (const std::string& name : names) {
    h5::Handle g = h5::open_group(configs, name);
    ConfigSummary c;
    c.group = name;
    c.policy = attr_or_empty(g, "policy");
    c.config_json = attr_or_empty(g, "config");
    c.complete = h5::has_attr(g, "complete") && h5::read_attr_int(g, "complete") == 1;
    h5::Handle a = h5::open_group(g, "aggregate");
    try {
      c.aggregate = read_aggregate(a, s.edges, s.schema_version);
    } catch (const std::exception& e) {
      throw std::runtime_error(fmt::format("{}: configs/{}/{}", path, name, e.what()));
    }
    s.configs.push_back(std::move(c));
  }
  return s;
}

}  // namespace

ResultsSummary read_results_summary(const std::string& path) {
  const h5::Handle f = h5::open_file(path);
  return read_summary(f, path);
}

// ---- cells -----------------------------------------------------------------------------------------
namespace {

// The exact counters and sums of KlStats a cell stores as attributes (merging cells is exact).
constexpr std::array<std::pair<const char*, int64_t KlStats::*>, 7> kCellCounts = {{
    {"positions", &KlStats::positions},
    {"finite_positions", &KlStats::finite_positions},
    {"nonfinite_positions", &KlStats::nonfinite_positions},
    {"ref_nonfinite_positions", &KlStats::ref_nonfinite_positions},
    {"nonfinite_values", &KlStats::nonfinite_values},
    {"top1_agree", &KlStats::top1_agree},
    {"delta_p_count", &KlStats::delta_p_count},
}};
constexpr std::array<std::pair<const char*, double KlStats::*>, 5> kCellSums = {{
    {"kl_sum", &KlStats::kl_sum},
    {"delta_p_sum", &KlStats::delta_p_sum},
    {"delta_p_sq_sum", &KlStats::delta_p_sq_sum},
    {"logratio_sum", &KlStats::logratio_sum},
    {"ref_nll_sum", &KlStats::ref_nll_sum},
}};
// Per-bucket [K] and per-block arrays of KlStats a cell stores.
constexpr std::array<std::pair<const char*, std::vector<int64_t> KlStats::*>, 3> kCellBucketCounts = {{
    {"bucket_count", &KlStats::bucket_count},
    {"bucket_top1_agree", &KlStats::bucket_top1_agree},
    {"bucket_target_count", &KlStats::bucket_target_count},
}};
constexpr std::array<std::pair<const char*, std::vector<double> KlStats::*>, 3> kCellBucketSums = {{
    {"bucket_sum", &KlStats::bucket_sum},
    {"bucket_delta_p_sq_sum", &KlStats::bucket_delta_p_sq_sum},
    {"bucket_logratio_sum", &KlStats::bucket_logratio_sum},
}};
constexpr std::array<std::pair<const char*, std::vector<int64_t> BlockSums::*>, 3> kCellBlockCounts = {{
    {"block_count", &BlockSums::count},
    {"block_top1_agree", &BlockSums::top1_agree},
    {"block_target_count", &BlockSums::target_count},
}};
constexpr std::array<std::pair<const char*, std::vector<double> BlockSums::*>, 2> kCellBlockSums = {{
    {"block_kl_sum", &BlockSums::kl_sum},
    {"block_logratio_sum", &BlockSums::logratio_sum},
}};

}  // namespace

void write_cell(const std::string& path, const CellRecord& c) {
  h5::NewFile f(path);
  h5::write_attr(f, "schema", std::string(kCellSchema));
  h5::write_attr(f, "sweep_id", c.sweep_id);
  h5::write_attr(f, "policy", c.policy);
  h5::write_attr(f, "book", c.book);
  h5::write_attr(f, "config_index", c.config_index);
  h5::write_attr(f, "book_index", c.book_index);
  h5::write_attr(f, "forward_seconds", c.forward_seconds);
  h5::write_attr(f, "kl_seconds", c.kl_seconds);
  h5::write_attr(f, "toolkit_version", c.toolkit_version);
  h5::write_attr(f, "host_isa", c.host_isa);
  h5::write_attr(f, "device", c.device);
  const KlStats& s = c.stats;
  for (const auto& [name, member] : kCellCounts) h5::write_attr(f, name, s.*member);
  for (const auto& [name, member] : kCellSums) h5::write_attr(f, name, s.*member);
  h5::write_dataset(f, "kl", {c.kl.size()}, c.kl.data(), {65536});
  h5::write_dataset(f, "edges", {s.edges.size()}, s.edges.data());
  for (const auto& [name, member] : kCellBucketCounts) h5::write_dataset(f, name, {(s.*member).size()}, (s.*member).data());
  for (const auto& [name, member] : kCellBucketSums) h5::write_dataset(f, name, {(s.*member).size()}, (s.*member).data());
  h5::write_attr(f, "block_length", s.blocks.block_length);
  const hsize_t n_blocks = s.blocks.size(), chunk = std::max<hsize_t>(1, n_blocks);
  for (const auto& [name, member] : kCellBlockCounts)
    h5::write_dataset(f, name, {n_blocks}, (s.blocks.*member).data(), {chunk});
  for (const auto& [name, member] : kCellBlockSums)
    h5::write_dataset(f, name, {n_blocks}, (s.blocks.*member).data(), {chunk});
  h5::write_dataset(f, "percentiles", {s.pct.value.size()}, s.pct.value.data());
  const std::vector<double> bucket_pct = flat_percentiles(s.bucket_pct);
  h5::write_dataset(f, "bucket_percentiles", {bucket_pct.size()}, bucket_pct.data());
  f.commit();
}

CellRecord read_cell(const std::string& path) {
  const h5::Handle f = h5::open_file(path);
  if (!h5::has_attr(f, "schema") || h5::read_attr_string(f, "schema") != kCellSchema)
    throw std::runtime_error(fmt::format("{}: not a kl-sweep cell file", path));
  CellRecord c;
  c.sweep_id = h5::read_attr_string(f, "sweep_id");
  c.policy = h5::read_attr_string(f, "policy");
  c.book = h5::read_attr_string(f, "book");
  c.config_index = h5::read_attr_int(f, "config_index");
  c.book_index = h5::read_attr_int(f, "book_index");
  c.forward_seconds = h5::read_attr_double(f, "forward_seconds");
  c.kl_seconds = h5::read_attr_double(f, "kl_seconds");
  c.toolkit_version = h5::read_attr_string(f, "toolkit_version");
  c.host_isa = attr_or_empty(f, "host_isa");
  c.device = attr_or_empty(f, "device");
  KlStats s(h5::read_dataset<int64_t>(f, "edges"));
  for (const auto& [name, member] : kCellCounts) s.*member = h5::read_attr_int(f, name);
  for (const auto& [name, member] : kCellSums) s.*member = h5::read_attr_double(f, name);
  if (s.edges.size() < 2) throw std::runtime_error(fmt::format("{}: fewer than 2 bucket edges", path));
  const std::size_t K = s.edges.size() - 1;
  const auto check = [&](const char* name, std::size_t got, std::size_t want) {
    if (got != want) throw std::runtime_error(fmt::format("{}: {} holds {} values, expected {}", path, name, got, want));
  };
  for (const auto& [name, member] : kCellBucketCounts) {
    s.*member = h5::read_dataset<int64_t>(f, name);
    check(name, (s.*member).size(), K);
  }
  for (const auto& [name, member] : kCellBucketSums) {
    s.*member = h5::read_dataset<double>(f, name);
    check(name, (s.*member).size(), K);
  }
  if (h5::read_attr_int(f, "block_length") != s.blocks.block_length)
    throw std::runtime_error(fmt::format("{}: bootstrap blocks of {} positions, expected {}", path,
                                         h5::read_attr_int(f, "block_length"), s.blocks.block_length));
  const std::size_t n_blocks = s.blocks.size();
  for (const auto& [name, member] : kCellBlockCounts) {
    s.blocks.*member = h5::read_dataset<int64_t>(f, name);
    check(name, (s.blocks.*member).size(), n_blocks);
  }
  for (const auto& [name, member] : kCellBlockSums) {
    s.blocks.*member = h5::read_dataset<double>(f, name);
    check(name, (s.blocks.*member).size(), n_blocks);
  }
  const auto pct = h5::read_dataset<double>(f, "percentiles");
  check("percentiles", pct.size(), s.pct.value.size());
  std::copy(pct.begin(), pct.end(), s.pct.value.begin());
  const auto bucket_pct = h5::read_dataset<double>(f, "bucket_percentiles");
  const std::size_t L = Percentiles::kLevels.size();
  check("bucket_percentiles", bucket_pct.size(), K * L);
  for (std::size_t k = 0; k < K; ++k)
    std::copy_n(bucket_pct.begin() + static_cast<std::ptrdiff_t>(k * L), L, s.bucket_pct[k].value.begin());
  // The per-book standard errors: recomputed from the stored blocks (the same blocks, the same SEs).
  const BlockSums* one = &s.blocks;
  s.se = block_bootstrap(std::span<const BlockSums* const>(&one, 1), s.edges);
  c.kl = h5::read_dataset<float>(f, "kl");
  if (s.positions != static_cast<int64_t>(c.kl.size()) || s.edges.back() != s.positions)
    throw std::runtime_error(fmt::format("{}: {} KL values for {} positions (edges end at {})", path, c.kl.size(),
                                         s.positions, s.edges.back()));
  c.stats = std::move(s);
  return c;
}

}  // namespace replayssm::eval
