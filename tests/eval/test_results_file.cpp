// The KL-sweep result schema (eval/results_file.h): writer and summary reader agree, cells
// round-trip exactly, the statistics table matches the documentation, and files that are not
// whole or not ours are refused with the file named.
#include <doctest/doctest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "eval/results_file.h"
#include "eval/statistics_table.h"
#include "io/hdf5.h"
#include "test_util.h"

using namespace replayssm;
using namespace replayssm::eval;
namespace fs = std::filesystem;
namespace h5 = replayssm::io::h5;

namespace {

fs::path fresh_dir(const std::string& name) { return replayssm::test::fresh_dir("results_" + name); }

KlStats stats_with(const std::vector<int64_t>& edges, std::initializer_list<double> kls, std::vector<float>* kl_out) {
  KlStats s(edges);
  int64_t p = 0;
  for (double k : kls) {
    PositionResult r;
    r.kl = k;
    r.finite = std::isfinite(k);
    r.has_target = true;
    r.delta_p = 0.01 * static_cast<double>(p + 1);
    r.top1_agree = p % 2 == 0;
    r.nonfinite_values = r.finite ? 0 : 2;
    s.add(p++, r);
    kl_out->push_back(static_cast<float>(k));
  }
  s.pct = percentiles(*kl_out);
  return s;
}

struct Sample {
  ResultsMetadata meta;
  std::vector<ResultsBook> books;
  std::vector<int64_t> edges;
  std::vector<float> k0, k1;
  KlStats s0, s1, agg;
};

Sample sample() {
  Sample x;
  const int64_t N = 4;
  x.edges = length_bucket_edges(N);
  x.meta.toolkit_version = "0.1.0 (git test)";
  x.meta.git_commit = "test";
  x.meta.host_isa = "portable";
  x.meta.created = "2026-11-30T00:00:00Z";
  x.meta.model_description = "m";
  x.meta.model_hash = "h";
  x.meta.sweep_json = R"({"n_positions":4})";
  x.meta.n_positions = N;
  x.meta.toolkit_versions_used = {"a", "b\"c"};
  x.books = {{"b0", "b0.txt", "00", 10, {1, 2, 3, 4, 5}}, {"b1", "b1.txt", "11", 12, {5, 4, 3, 2, 1}}};
  x.s0 = stats_with(x.edges, {0.1, 0.2, NAN, 0.4}, &x.k0);
  x.s1 = stats_with(x.edges, {0.5, 0.5, 0.5, INFINITY}, &x.k1);
  x.agg = x.s0;
  x.agg.merge(x.s1);
  std::vector<float> all = x.k0;
  all.insert(all.end(), x.k1.begin(), x.k1.end());
  x.agg.pct = percentiles(all);
  return x;
}

void write_sample(const std::string& path, const Sample& x) {
  ResultsWriter w(path, x.meta, x.books, x.edges);
  const ConfigAttributes a{"split:nvfp4+rtn/fp32@16", R"({"window":16})", "v", 1.5, 0.0};
  w.add_config(a, {x.s0, x.s1}, x.agg, [&](std::size_t b) { return b == 0 ? x.k0 : x.k1; });
  w.commit();
}

std::string file_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

TEST_CASE("result files: writer and summary reader agree; an unfinished writer leaves nothing") {
  const fs::path d = fresh_dir("results");
  const std::string path = (d / "r.h5").string();
  const Sample x = sample();
  {
    ResultsWriter w(path, x.meta, x.books, x.edges);
    // destroyed without commit: nothing was ever written
  }
  CHECK(fs::is_empty(d));
  CHECK_THROWS_AS(ResultsWriter(path, x.meta, {{"x", "x.txt", "0", 1, {1}}}, x.edges), std::invalid_argument);
  CHECK(fs::is_empty(d));
  {
    ResultsWriter w(path, x.meta, x.books, x.edges);
    ConfigAttributes a;
    a.policy = "p";
    CHECK_THROWS_AS(w.add_config(a, {x.s0}, x.agg, [&](std::size_t) { return x.k0; }), std::invalid_argument);
  }
  write_sample(path, x);
  CHECK(fs::exists(path));
  CHECK(std::distance(fs::directory_iterator(d), fs::directory_iterator()) == 1);

  const ResultsSummary r = read_results_summary(path);
  CHECK(r.complete);
  CHECK(r.schema_version == 2);
  CHECK(r.meta.sweep_json == x.meta.sweep_json);
  CHECK(r.meta.model_hash == "h");
  CHECK(r.meta.host_isa == "portable");
  CHECK(r.book_names == std::vector<std::string>{"b0", "b1"});
  CHECK(r.edges == x.edges);
  REQUIRE(r.configs.size() == 1);
  const ConfigSummary& c = r.configs[0];
  CHECK(c.group == "split:nvfp4+rtn|fp32@16");
  CHECK(c.policy == "split:nvfp4+rtn/fp32@16");
  CHECK(c.complete);
  // Everything the table restores comes back: counts exactly, sums from the stored means.
  CHECK(c.aggregate.positions == 8);
  CHECK(c.aggregate.finite_positions == 6);
  CHECK(c.aggregate.nonfinite_positions == 2);
  CHECK(c.aggregate.nonfinite_values == 4);
  CHECK(c.aggregate.bucket_count == x.agg.bucket_count);
  CHECK(c.aggregate.bucket_sum == x.agg.bucket_sum);
  CHECK(c.aggregate.top1_agree == x.agg.top1_agree);
  CHECK(c.aggregate.mean_kl() == doctest::Approx(x.agg.mean_kl()).epsilon(1e-15));
  CHECK(c.aggregate.mean_delta_p() == doctest::Approx(x.agg.mean_delta_p()).epsilon(1e-15));
  CHECK(c.aggregate.pct.value == x.agg.pct.value);

  // Everything, through the C API.
  h5::Handle f = h5::open_file(path);
  CHECK(nlohmann::json::parse(h5::read_attr_string(f, "toolkit_versions_used")) ==
        nlohmann::json::array({"a", "b\"c"}));
  CHECK(h5::read_attr_string(f, "host_isa") == "portable");
  h5::Handle g = h5::open_group(f, "configs/split:nvfp4+rtn|fp32@16");
  CHECK(h5::read_attr_double(g, "forward_seconds") == 1.5);
  const auto kl = h5::read_dataset<float>(g, "kl");
  CHECK(kl[0] == 0.1f);
  CHECK(std::isnan(kl[2]));
  CHECK(kl[7] == INFINITY);
  CHECK(h5::read_dataset<int64_t>(g, "nonfinite_positions") == std::vector<int64_t>{1, 1});
  CHECK(h5::read_dataset<int64_t>(g, "finite_positions") == std::vector<int64_t>{3, 3});
  std::vector<hsize_t> dims;
  const auto pct = h5::read_dataset<double>(g, "percentiles", &dims);
  CHECK(dims == std::vector<hsize_t>{2, 5});
  CHECK(pct[4] == doctest::Approx(0.4).epsilon(1e-7));  // book 0 max
  CHECK(pct[5] == 0.5);                                  // book 1 p50
  CHECK(h5::has_attr(h5::open_dataset(g, "percentiles"), "levels"));
  CHECK(h5::has_attr(h5::open_dataset(g, "aggregate/percentiles"), "levels"));
  h5::read_dataset<double>(g, "bucket_mean", &dims);
  CHECK(dims == std::vector<hsize_t>{2, x.edges.size() - 1});
  CHECK(h5::read_dataset<double>(g, "top1") == std::vector<double>{1.0 / 3.0, 2.0 / 3.0});
  const auto bm = h5::read_dataset<double>(g, "aggregate/bucket_mean", &dims);
  CHECK(dims == std::vector<hsize_t>{x.edges.size() - 1});
  h5::read_dataset<int64_t>(g, "aggregate/positions", &dims);
  CHECK(dims.empty());  // a scalar dataset
  CHECK(h5::read_dataset<int64_t>(f, "books/n_tokens") == std::vector<int64_t>{10, 12});
  fs::remove_all(d);
}

TEST_CASE("the statistics table drives every group and is the one docs/KL_SWEEP.md lists") {
  std::vector<std::string> names;
  for (const StatField& f : stat_fields()) names.push_back(f.name);
  CHECK(names == std::vector<std::string>{"bucket_mean",
                                          "bucket_sum",
                                          "bucket_count",
                                          "bucket_mean_se",
                                          "bucket_top1",
                                          "bucket_top1_se",
                                          "bucket_rms_delta_p",
                                          "bucket_target_count",
                                          "bucket_ppl_ratio",
                                          "bucket_ppl_ratio_se",
                                          "bucket_percentiles",
                                          "mean_kl",
                                          "mean_kl_se",
                                          "top1",
                                          "top1_se",
                                          "delta_p",
                                          "rms_delta_p",
                                          "ppl_ratio",
                                          "ppl_ratio_se",
                                          "ppl",
                                          "ref_ppl",
                                          "percentiles",
                                          "positions",
                                          "finite_positions",
                                          "nonfinite_positions",
                                          "ref_nonfinite_positions",
                                          "nonfinite_values",
                                          "mean_kl_book_se",
                                          "bucket_mean_book_se",
                                          "mean_kl_seed_se",
                                          "bucket_mean_seed_se"});
  // Each field is written per book and in the aggregate, with the documented type.
  const fs::path d = fresh_dir("table");
  const std::string path = (d / "r.h5").string();
  write_sample(path, sample());
  h5::Handle f = h5::open_file(path);
  h5::Handle g = h5::open_group(f, "configs/split:nvfp4+rtn|fp32@16");
  for (const StatField& field : stat_fields()) {
    CAPTURE(field.name);
    CHECK(h5::has_link(g, field.name) == !field.aggregate_only);
    for (const std::string& where : {"aggregate/" + std::string(field.name), std::string(field.name)}) {
      if (field.aggregate_only && where == field.name) continue;
      if (field.integer) {
        CHECK_NOTHROW(h5::read_dataset<int64_t>(g, where));
        CHECK_THROWS_WITH(h5::read_dataset<double>(g, where), doctest::Contains("expected float64"));
      } else {
        CHECK_NOTHROW(h5::read_dataset<double>(g, where));
        CHECK_THROWS_WITH(h5::read_dataset<int64_t>(g, where), doctest::Contains("expected int64"));
      }
    }
  }
  // The documentation's schema table names every field.
  std::ifstream in(test::source_path("docs/KL_SWEEP.md"));
  REQUIRE(in);
  std::ostringstream doc;
  doc << in.rdbuf();
  const std::string text = doc.str();
  const std::size_t schema = text.find("## Result file");
  REQUIRE(schema != std::string::npos);
  for (const StatField& field : stat_fields()) {
    CAPTURE(field.name);
    CHECK(text.find("`…/" + std::string(field.name) + "`", schema) != std::string::npos);
  }
  CHECK(text.find("`host_isa`", schema) != std::string::npos);
  fs::remove_all(d);
}

TEST_CASE("result files that are not whole, not ours or not consistent are refused, naming the file") {
  const fs::path d = fresh_dir("hostile");
  const std::string good = (d / "good.h5").string();
  write_sample(good, sample());
  const std::string bytes = file_bytes(good);

  // Truncated (a copy cut short, a disk that filled under another tool).
  for (std::size_t keep : {std::size_t{0}, std::size_t{7}, std::size_t{600}, bytes.size() / 2, bytes.size() - 1}) {
    CAPTURE(keep);
    const fs::path cut = d / "cut.h5";
    std::ofstream(cut, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(keep));
    CHECK_THROWS_WITH(read_results_summary(cut.string()), doctest::Contains(cut.string().c_str()));
  }
  // Another schema, another version, a cell file, inconsistent arrays.
  const auto variant = [&](const std::string& name, const auto& edit) {
    const std::string p = (d / name).string();
    Sample x = sample();
    edit(x);
    write_sample(p, x);
    return p;
  };
  {
    const std::string p = (d / "other.h5").string();
    h5::NewFile other(p);
    h5::write_attr(other, "schema", std::string("something-else"));
    other.commit();
    CHECK_THROWS_WITH(read_results_summary(p), doctest::Contains((p + ": not a replayssm kl-sweep result file (schema").c_str()));
  }
  {
    const std::string p = (d / "v3.h5").string();
    h5::NewFile v3(p);
    h5::write_attr(v3, "schema", std::string(kResultsSchema));
    h5::write_attr(v3, "schema_version", int64_t{3});
    v3.commit();
    CHECK_THROWS_WITH(read_results_summary(p),
                      doctest::Contains((p + ": result schema version 3 (this build reads 1 to 2)").c_str()));
  }
  {
    const std::string p = (d / "c.h5").string();
    CellRecord c;
    c.stats = stats_with(length_bucket_edges(2), {0.1, 0.2}, &c.kl);
    write_cell(p, c);
    CHECK_THROWS_WITH(read_results_summary(p), doctest::Contains("schema 'replayssm-kl-sweep-cell'"));
    CHECK_THROWS_WITH(read_cell(good), doctest::Contains((good + ": not a kl-sweep cell file").c_str()));
  }
  const std::string bad_n = variant("n.h5", [](Sample& x) { x.meta.n_positions = 5; x.books[0].tokens.push_back(0);
                                                             x.books[1].tokens.push_back(0);
                                                             x.k0.push_back(0.0f); x.k1.push_back(0.0f); });
  CHECK_THROWS_WITH(read_results_summary(bad_n), doctest::Contains("bucket_edges [0,4] do not rise from 0 to n_positions = 5"));
  // The writer refuses statistics whose buckets do not match the edges (the reader's check on
  // such files runs in tests/python/test_sweep_io_faults.py, on a file edited with h5py).
  CHECK_THROWS_WITH(variant("k.h5", [](Sample& x) { x.agg.bucket_count.push_back(0); }),
                    doctest::Contains("bucket_count of the aggregate has 2 values, expected 1 (K = 1)"));
  CHECK_THROWS_WITH(variant("k.h5", [](Sample& x) { x.s1.bucket_count.push_back(0); }),
                    doctest::Contains("bucket_count of book 1 has 2 values, expected 1 (K = 1)"));
  CHECK_FALSE(fs::exists(d / "k.h5"));
  fs::remove_all(d);
}

TEST_CASE("sweep cells round-trip exactly; inconsistent cells are refused") {
  const fs::path d = fresh_dir("cell");
  const auto edges = length_bucket_edges(3);
  CellRecord c;
  c.sweep_id = "abc";
  c.policy = "shared:nvfp4+sr@16";
  c.book = "10146";
  c.config_index = 2;
  c.book_index = 5;
  c.stats = stats_with(edges, {0.1, NAN, 0.3}, &c.kl);
  c.forward_seconds = 1.25;
  c.kl_seconds = 0.5;
  c.toolkit_version = "v";
  c.host_isa = "native (avx2+fma)";
  const std::string path = (d / "c0002-b00005.h5").string();
  write_cell(path, c);
  CHECK(std::distance(fs::directory_iterator(d), fs::directory_iterator()) == 1);
  const CellRecord r = read_cell(path);
  CHECK(r.sweep_id == "abc");
  CHECK(r.policy == c.policy);
  CHECK(r.book == "10146");
  CHECK(r.config_index == 2);
  CHECK(r.book_index == 5);
  CHECK(r.forward_seconds == 1.25);
  CHECK(r.kl_seconds == 0.5);
  CHECK(r.toolkit_version == "v");
  CHECK(r.host_isa == "native (avx2+fma)");
  CHECK(r.kl.size() == 3);
  CHECK(std::isnan(r.kl[1]));
  CHECK(r.stats.edges == edges);
  CHECK(r.stats.bucket_sum == c.stats.bucket_sum);
  CHECK(r.stats.bucket_count == c.stats.bucket_count);
  CHECK(r.stats.kl_sum == c.stats.kl_sum);
  CHECK(r.stats.delta_p_sum == c.stats.delta_p_sum);
  CHECK(r.stats.delta_p_count == c.stats.delta_p_count);
  CHECK(r.stats.top1_agree == c.stats.top1_agree);
  CHECK(r.stats.positions == 3);
  CHECK(r.stats.finite_positions == 2);
  CHECK(r.stats.nonfinite_positions == 1);
  CHECK(r.stats.ref_nonfinite_positions == 0);
  CHECK(r.stats.nonfinite_values == 2);
  CHECK(r.stats.pct.value == c.stats.pct.value);

  // KL values that do not match the counts (a cell of another length renamed into place).
  CellRecord shorter = c;
  shorter.kl.pop_back();
  write_cell(path, shorter);
  CHECK_THROWS_WITH(read_cell(path), doctest::Contains((path + ": 2 KL values for 3 positions").c_str()));
  fs::remove_all(d);
}

TEST_CASE("configuration group names") {
  CHECK(config_group_name("split:nvfp4+rtn/fp16+sr@16,seed=2") == "split:nvfp4+rtn|fp16+sr@16,seed=2");
  CHECK(config_group_name("") == "_");
  CHECK(config_group_name(".") == "_.");
}

TEST_CASE("the committed result files of experiments/results are still read") {
  int files = 0;
  for (const auto& e : fs::directory_iterator(test::source_path("experiments/results"))) {
    if (e.path().extension() != ".h5") continue;
    CAPTURE(e.path().string());
    ++files;
    const ResultsSummary s = read_results_summary(e.path().string());
    CHECK(s.complete);
    // Version 1 (written before the uncertainty statistics) or the current one; never rewritten.
    CHECK((s.schema_version == 1 || s.schema_version == kResultsSchemaVersion));
    CHECK_FALSE(s.configs.empty());
    CHECK(s.edges.back() == s.meta.n_positions);
    for (const ConfigSummary& c : s.configs) {
      CHECK(c.complete);
      CHECK(c.aggregate.positions == s.meta.n_positions * static_cast<int64_t>(s.book_names.size()));
      CHECK(c.aggregate.finite_positions + c.aggregate.nonfinite_positions == c.aggregate.positions);
      CHECK(std::isfinite(c.aggregate.mean_kl()));
      CHECK(std::isfinite(c.aggregate.pct.value[4]));  // max: stored in version 1 too
      if (s.schema_version == 1) {  // what version 1 did not store reads as undefined, not as 0
        CHECK(std::isnan(c.aggregate.pct.value[3]));
        CHECK(std::isnan(c.aggregate.se.mean_kl));
        CHECK(std::isnan(c.aggregate.ppl_ratio()));
        CHECK(std::isnan(c.aggregate.rms_delta_p()));
        CHECK(std::isnan(c.aggregate.bucket_top1()[0]));
        CHECK(std::isnan(c.aggregate.bucket_ppl_ratio()[0]));
        CHECK(std::isnan(c.aggregate.bucket_pct[0].value[0]));
      }
    }
    // The summary tables print from what was read (version 1: '-' for what it lacks).
    std::vector<SummaryRow> rows;
    for (const ConfigSummary& c : s.configs) rows.push_back({c.policy, c.aggregate});
    const std::string table = format_statistics_table(rows);
    CHECK(static_cast<std::size_t>(std::count(table.begin(), table.end(), '\n')) >= rows.size() + 2);
  }
  CHECK(files >= 3);
}
