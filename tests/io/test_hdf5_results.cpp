#include <doctest/doctest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>

#include "io/hdf5_results.h"

using namespace replayssm;
using namespace replayssm::io;
namespace fs = std::filesystem;

namespace {

fs::path fresh_dir(const std::string& name) {
  const fs::path d = fs::temp_directory_path() / ("replayssm_test_h5_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

eval::KlStats stats_with(const std::vector<int64_t>& edges, std::initializer_list<double> kls, std::vector<float>* kl_out) {
  eval::KlStats s(edges);
  int64_t p = 0;
  for (double k : kls) {
    eval::PositionResult r;
    r.kl = k;
    r.finite = std::isfinite(k);
    r.has_target = true;
    r.delta_p = 0.01;
    r.top1_agree = p % 2 == 0;
    r.nonfinite_values = r.finite ? 0 : 2;
    s.add(p++, r);
    kl_out->push_back(static_cast<float>(k));
  }
  s.pct = eval::percentiles(*kl_out);
  return s;
}

}  // namespace

TEST_CASE("HDF5 wrappers round-trip attributes, datasets and strings through the C API") {
  const fs::path d = fresh_dir("wrap");
  const std::string path = (d / "a.h5").string();
  {
    h5::Handle f = h5::create_file(path);
    h5::write_attr(f, "s", std::string("héllo \"json\""));
    h5::write_attr(f, "i", int64_t{-42});
    h5::write_attr(f, "x", 2.5);
    h5::write_attr(f, "x", 3.5);  // rewriting replaces
    const std::vector<double> arr = {1, 2, 3};
    h5::write_attr(f, "arr", std::span<const double>(arr));
    h5::Handle g = h5::create_group(f, "g");
    const std::vector<float> fl = {1.5f, NAN, INFINITY, -0.0f, 3, 4};
    h5::write_dataset(g, "f", {2, 3}, fl.data(), {1, 3});
    const std::vector<int64_t> il = {1, 2, 3};
    h5::write_dataset(g, "i", {3}, il.data());
    const int32_t i32[2] = {7, -8};
    h5::write_dataset(g, "i32", {2}, i32);
    const double scalar = 0.25;
    h5::write_dataset(g, "scalar", {}, &scalar);
    h5::write_strings(g, "names", {"a", "", "split:nvfp4+rtn|fp32@16"});
    h5::RowWriter w(g, "rows", 3, 4);
    const std::vector<float> r1 = {1, 2, 3, 4};
    w.write_row(1, r1);
    CHECK_THROWS_AS(w.write_row(3, r1), std::invalid_argument);
    CHECK_THROWS_AS(h5::create_group(f, "g"), std::runtime_error);
  }
  h5::Handle f = h5::open_file(path);
  CHECK(h5::read_attr_string(f, "s") == "héllo \"json\"");
  CHECK(h5::read_attr_int(f, "i") == -42);
  CHECK(h5::read_attr_double(f, "x") == 3.5);
  CHECK(h5::has_attr(f, "arr"));
  CHECK_FALSE(h5::has_attr(f, "nope"));
  CHECK(h5::has_link(f, "g"));
  CHECK_FALSE(h5::has_link(f, "h"));
  h5::Handle g = h5::open_group(f, "g");
  std::vector<hsize_t> dims;
  const auto fl = h5::read_dataset<float>(g, "f", &dims);
  CHECK(dims == std::vector<hsize_t>{2, 3});
  CHECK(fl[0] == 1.5f);
  CHECK(std::isnan(fl[1]));
  CHECK(fl[2] == INFINITY);
  CHECK(std::signbit(fl[3]));
  CHECK(h5::read_dataset<int64_t>(g, "i") == std::vector<int64_t>{1, 2, 3});
  CHECK(h5::read_dataset<int32_t>(g, "i32") == std::vector<int32_t>{7, -8});
  CHECK(h5::read_dataset<double>(g, "scalar", &dims) == std::vector<double>{0.25});
  CHECK(dims.empty());
  CHECK(h5::read_strings(g, "names") == std::vector<std::string>{"a", "", "split:nvfp4+rtn|fp32@16"});
  CHECK(h5::read_row(g, "rows", 1) == std::vector<float>{1, 2, 3, 4});
  CHECK(h5::read_row(g, "rows", 0) == std::vector<float>{0, 0, 0, 0});  // unwritten rows read as the fill value
  CHECK_THROWS_WITH(h5::read_attr_string(f, "nope"), doctest::Contains("no attribute nope"));
  CHECK_THROWS_WITH(h5::read_dataset<float>(g, "nope"), doctest::Contains("no dataset nope"));
  CHECK_THROWS_WITH(h5::read_attr_string(f, "i"), doctest::Contains("not a string"));
  {
    std::ofstream(d / "text.h5") << "not hdf5";
  }
  CHECK_THROWS_WITH(h5::open_file((d / "text.h5").string()), doctest::Contains("not an HDF5 file"));
  CHECK_THROWS_WITH(h5::open_file((d / "none.h5").string()), doctest::Contains("no such file"));
  fs::remove_all(d);
}

TEST_CASE("temporary names and atomic commit") {
  const std::string t = temp_path_for("/x/y/results.h5");
  CHECK(t == "/x/y/.results.h5.tmp-" + std::to_string(::getpid()));
  const fs::path d = fresh_dir("commit");
  std::ofstream(d / "a.tmp") << "new";
  std::ofstream(d / "a") << "old";
  commit_file((d / "a.tmp").string(), (d / "a").string());
  CHECK_FALSE(fs::exists(d / "a.tmp"));
  std::ifstream in(d / "a");
  std::string s;
  in >> s;
  CHECK(s == "new");
  CHECK_THROWS(commit_file((d / "missing").string(), (d / "a").string()));
  CHECK(config_group_name("split:nvfp4+rtn/fp16+sr@16,seed=2") == "split:nvfp4+rtn|fp16+sr@16,seed=2");
  fs::remove_all(d);
}

TEST_CASE("result files: writer and summary reader agree; an unfinished writer leaves nothing") {
  const fs::path d = fresh_dir("results");
  const std::string path = (d / "r.h5").string();
  const int64_t N = 4;
  const auto edges = eval::length_bucket_edges(N);
  ResultsMetadata meta;
  meta.toolkit_version = "0.1.0 (git test)";
  meta.git_commit = "test";
  meta.created = "2026-11-30T00:00:00Z";
  meta.model_description = "m";
  meta.model_hash = "h";
  meta.sweep_json = R"({"n_positions":4})";
  meta.n_positions = N;
  meta.toolkit_versions_used = {"a", "b\"c"};
  std::vector<ResultsBook> books(2);
  books[0] = {"b0", "b0.txt", "00", 10, {1, 2, 3, 4, 5}};
  books[1] = {"b1", "b1.txt", "11", 12, {5, 4, 3, 2, 1}};
  {
    ResultsWriter w(path, meta, books, edges);
    CHECK(fs::exists(w.temp_path()));
    // destroyed without commit: the temporary goes away, no result appears
  }
  CHECK(fs::is_empty(d));
  CHECK_THROWS_AS(ResultsWriter(path, meta, {{"x", "x.txt", "0", 1, {1}}}, edges), std::invalid_argument);
  CHECK(fs::is_empty(d));

  std::vector<float> k0, k1;
  const eval::KlStats s0 = stats_with(edges, {0.1, 0.2, NAN, 0.4}, &k0);
  const eval::KlStats s1 = stats_with(edges, {0.5, 0.5, 0.5, INFINITY}, &k1);
  eval::KlStats agg = s0;
  agg.merge(s1);
  std::vector<float> all = k0;
  all.insert(all.end(), k1.begin(), k1.end());
  agg.pct = eval::percentiles(all);
  {
    ResultsWriter w(path, meta, books, edges);
    ConfigAttributes a;
    a.policy = "split:nvfp4+rtn/fp32@16";
    a.config_json = R"({"window":16})";
    a.toolkit_version = "v";
    a.forward_seconds = 1.5;
    w.add_config(a, {s0, s1}, agg, [&](std::size_t b) { return b == 0 ? k0 : k1; });
    CHECK_THROWS_AS(w.add_config(a, {s0}, agg, [&](std::size_t) { return k0; }), std::invalid_argument);
    w.commit();
  }
  CHECK(fs::exists(path));
  CHECK(std::distance(fs::directory_iterator(d), fs::directory_iterator()) == 1);

  const ResultsSummary r = read_results_summary(path);
  CHECK(r.complete);
  CHECK(r.schema_version == 1);
  CHECK(r.meta.sweep_json == meta.sweep_json);
  CHECK(r.meta.model_hash == "h");
  CHECK(r.book_names == std::vector<std::string>{"b0", "b1"});
  CHECK(r.edges == edges);
  REQUIRE(r.configs.size() == 1);
  CHECK(r.configs[0].group == "split:nvfp4+rtn|fp32@16");
  CHECK(r.configs[0].policy == "split:nvfp4+rtn/fp32@16");
  CHECK(r.configs[0].complete);
  CHECK(r.configs[0].aggregate.finite_positions == 6);
  CHECK(r.configs[0].aggregate.nonfinite_positions == 2);
  CHECK(r.configs[0].aggregate.nonfinite_values == 4);
  CHECK(r.configs[0].aggregate.mean_kl() == doctest::Approx(agg.mean_kl()).epsilon(1e-15));
  CHECK(r.configs[0].aggregate.pct.value == agg.pct.value);

  // Everything, through the C API.
  h5::Handle f = h5::open_file(path);
  CHECK(h5::read_attr_string(f, "toolkit_versions_used") == R"(["a", "b\"c"])");
  h5::Handle g = h5::open_group(f, "configs/split:nvfp4+rtn|fp32@16");
  CHECK(h5::read_attr_double(g, "forward_seconds") == 1.5);
  const auto kl = h5::read_dataset<float>(g, "kl");
  CHECK(kl[0] == 0.1f);
  CHECK(std::isnan(kl[2]));
  CHECK(kl[7] == INFINITY);
  CHECK(h5::read_dataset<int64_t>(g, "nonfinite_positions") == std::vector<int64_t>{1, 1});
  CHECK(h5::read_dataset<int64_t>(g, "finite_positions") == std::vector<int64_t>{3, 3});
  const auto pct = h5::read_dataset<double>(g, "percentiles");
  CHECK(pct[3] == doctest::Approx(0.4).epsilon(1e-7));   // book 0 max
  CHECK(pct[4] == 0.5);                                   // book 1 p50
  CHECK(h5::read_dataset<double>(g, "top1") == std::vector<double>{1.0 / 3.0, 2.0 / 3.0});
  const auto bm = h5::read_dataset<double>(g, "aggregate/bucket_mean");
  CHECK(bm.size() == edges.size() - 1);
  CHECK(h5::read_dataset<int64_t>(f, "books/n_tokens") == std::vector<int64_t>{10, 12});

  // Not a result file.
  {
    h5::Handle other = h5::create_file((d / "other.h5").string());
    h5::write_attr(other, "schema", std::string("something-else"));
  }
  CHECK_THROWS_WITH(read_results_summary((d / "other.h5").string()), doctest::Contains("not a replayssm kl-sweep"));
  fs::remove_all(d);
}

TEST_CASE("sweep cells round-trip exactly") {
  const fs::path d = fresh_dir("cell");
  const auto edges = eval::length_bucket_edges(3);
  CellRecord c;
  c.sweep_id = "abc";
  c.policy = "shared:nvfp4+sr@16";
  c.book = "10146";
  c.config_index = 2;
  c.book_index = 5;
  c.stats = stats_with(edges, {0.1, NAN, 0.3}, &c.kl);
  c.forward_seconds = 1.25;
  c.kl_seconds = 0.5;
  c.toolkit_version.append("v");
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
  CHECK(r.kl.size() == 3);
  CHECK(std::isnan(r.kl[1]));
  CHECK(r.stats.edges == edges);
  CHECK(r.stats.bucket_sum == c.stats.bucket_sum);
  CHECK(r.stats.bucket_count == c.stats.bucket_count);
  CHECK(r.stats.kl_sum == c.stats.kl_sum);
  CHECK(r.stats.top1_agree == c.stats.top1_agree);
  CHECK(r.stats.nonfinite_positions == 1);
  CHECK(r.stats.nonfinite_values == 2);
  CHECK(r.stats.pct.value == c.stats.pct.value);
  fs::remove_all(d);
}
