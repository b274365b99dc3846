// End-to-end tests of the KL sweep on a real (tiny) SSM model: the result file's schema read back
// with the HDF5 C API, KL against a direct computation, resume after an interruption, refusal to
// overwrite, --force, a configuration that changes between runs, the output lock and NaN states.
#include <doctest/doctest.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <boost/random/mersenne_twister.hpp>
#include <boost/random/uniform_int_distribution.hpp>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "eval/cell_store.h"
#include "eval/kl_oracle.h"
#include "eval/kl_sweep.h"
#include "sweep_books.h"
#include "eval/results_file.h"
#include "io/hdf5.h"
#include "test_util.h"
#include "tiny_ssm_model.h"
#include "util/version.h"

using namespace replayssm;
using replayssm::test::TinySsmModel;
namespace fs = std::filesystem;

namespace {

fs::path fresh_dir(const std::string& name) { return replayssm::test::fresh_dir("kl_sweep_" + name); }

using replayssm::test::make_books;

eval::SweepOptions options(const fs::path& out, int64_t n, const std::vector<std::string>& specs,
                           std::vector<int> windows = {4}) {
  eval::SweepOptions o;
  o.n_positions = n;
  std::vector<ssm::PolicySpec> parsed;
  for (const std::string& s : specs) parsed.push_back(ssm::parse_policy_spec(s));
  o.policies = eval::expand_policies(parsed, windows, {0});
  o.out_path = out.string();
  o.chunk_rows = 64;
  o.threads = 2;
  o.progress = "off";
  o.command_line = "test_eval";
  return o;
}

std::vector<std::string> listing(const fs::path& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

std::string file_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

using replayssm::test::direct_kl;

}  // namespace

TEST_CASE("the spreads over books and SR seeds: configurations differing only by their seed form a group") {
  const fs::path dir = fresh_dir("seeds");
  TinySsmModel model({});
  const int64_t N = 96;
  const auto books = make_books(3, N + 1, model.vocab_size(), 13);
  auto o = options(dir / "res.h5", N, {"shared:nvfp4+rtn"});
  for (uint64_t seed : {0u, 1u, 2u}) {
    ssm::PrecisionPolicy p = ssm::PrecisionPolicy::parse("shared:nvfp4+sr@4");
    p.seed = seed;
    o.policies.push_back(p);
  }
  const eval::SweepOutcome r = eval::run_kl_sweep(model, books, o);
  REQUIRE(r.rows.size() == 4);
  // RTN has no seeds: no group, no seed spread.
  CHECK(r.rows[0].stats.seed_group.empty());
  CHECK(std::isnan(r.rows[0].stats.mean_kl_seed_se));
  std::vector<double> means;
  for (std::size_t c = 1; c < 4; ++c) means.push_back(r.rows[c].stats.mean_kl());
  const double mu = (means[0] + means[1] + means[2]) / 3;
  double ss = 0;
  for (double m : means) ss += (m - mu) * (m - mu);
  const double seed_se = std::sqrt(ss / 2) / std::sqrt(3.0);
  CHECK(seed_se > 0);  // three seeds, three realisations of the rounding noise
  const std::vector<std::string> group = {"shared:nvfp4+sr@4", "shared:nvfp4+sr@4,seed=1", "shared:nvfp4+sr@4,seed=2"};
  io::h5::Handle f = io::h5::open_file((dir / "res.h5").string());
  for (std::size_t c = 1; c < 4; ++c) {
    CAPTURE(c);
    const eval::KlStats& s = r.rows[c].stats;
    CHECK(s.seed_group == group);
    CHECK(s.mean_kl_seed_se == doctest::Approx(seed_se).epsilon(1e-12));
    // The spread over books, from the per-book means the file holds.
    io::h5::Handle g = io::h5::open_group(f, "configs/" + eval::config_group_name(group[c - 1]));
    const auto book_means = io::h5::read_dataset<double>(g, "mean_kl");
    REQUIRE(book_means.size() == 3);
    const double bm = (book_means[0] + book_means[1] + book_means[2]) / 3;
    double bss = 0;
    for (double m : book_means) bss += (m - bm) * (m - bm);
    CHECK(io::h5::read_scalar<double>(g, "aggregate/mean_kl_book_se") ==
          doctest::Approx(std::sqrt(bss / 2) / std::sqrt(3.0)).epsilon(1e-12));
    CHECK(io::h5::read_scalar<double>(g, "aggregate/mean_kl_seed_se") == s.mean_kl_seed_se);
    io::h5::Handle a = io::h5::open_group(g, "aggregate");
    CHECK(nlohmann::json::parse(io::h5::read_attr_string(a, "seed_group")) == nlohmann::json(group));
  }
  // Read back (a finished sweep's summary): the same numbers.
  const eval::ResultsSummary back = eval::read_results_summary((dir / "res.h5").string());
  CHECK(back.configs[2].aggregate.seed_group == group);
  CHECK(back.configs[2].aggregate.mean_kl_seed_se == r.rows[2].stats.mean_kl_seed_se);
  CHECK(back.configs[2].aggregate.se.mean_kl == r.rows[2].stats.se.mean_kl);
  CHECK(back.configs[2].aggregate.ppl_ratio() == doctest::Approx(r.rows[2].stats.ppl_ratio()).epsilon(1e-14));
}

TEST_CASE("a sweep writes the documented schema, and its KL is the model's KL computed directly") {
  const fs::path dir = fresh_dir("schema");
  TinySsmModel model({});
  const int64_t N = 200;
  const auto books = make_books(2, N + 5, model.vocab_size(), 11);
  auto o = options(dir / "res.h5", N, {"shared:nvfp4+sr", "split:nvfp4+rtn/fp32", "conv:fp32"});
  const eval::SweepOutcome r = eval::run_kl_sweep(model, books, o);
  CHECK_FALSE(r.already_complete);
  CHECK(r.cells_total == 6);
  CHECK(r.cells_run == 6);
  CHECK(model.forward_calls() == 2 + 6);  // one reference per book, one per cell
  CHECK(listing(dir) == std::vector<std::string>{"res.h5"});  // no lock, work dir or temporaries left
  REQUIRE(r.rows.size() == 3);
  CHECK(r.rows[0].policy == "shared:nvfp4+sr@4");

  // Read back with the C API.
  io::h5::Handle f = io::h5::open_file((dir / "res.h5").string());
  CHECK(io::h5::read_attr_string(f, "schema") == "replayssm-kl-sweep");
  CHECK(io::h5::read_attr_int(f, "schema_version") == eval::kResultsSchemaVersion);
  CHECK(io::h5::read_attr_int(f, "complete") == 1);
  CHECK(io::h5::read_attr_int(f, "n_positions") == N);
  CHECK(io::h5::read_attr_int(f, "n_books") == 2);
  CHECK(io::h5::read_attr_string(f, "model_hash") == model.content_hash());
  CHECK(io::h5::read_attr_string(f, "reference_policy") == "conv:fp32");
  CHECK(io::h5::read_attr_string(f, "command_line") == "test_eval");
  CHECK(io::h5::read_attr_string(f, "created").size() == 20);
  const auto id = nlohmann::json::parse(io::h5::read_attr_string(f, "sweep"));
  CHECK(id == eval::sweep_identity(model, books, o));
  CHECK(io::h5::read_strings(f, "config_order") ==
        std::vector<std::string>{"shared:nvfp4+sr@4", "split:nvfp4+rtn|fp32@4", "conv:fp32"});
  CHECK(io::h5::read_dataset<int64_t>(f, "bucket_edges") == eval::length_bucket_edges(N));
  {
    io::h5::Handle b = io::h5::open_group(f, "books");
    CHECK(io::h5::read_strings(b, "name") == std::vector<std::string>{"book00", "book01"});
    std::vector<hsize_t> dims;
    const auto tokens = io::h5::read_dataset<int32_t>(b, "tokens", &dims);
    CHECK(dims == std::vector<hsize_t>{2, static_cast<hsize_t>(N + 1)});
    CHECK(std::equal(tokens.begin(), tokens.begin() + N + 1, books[0].tokens.begin()));
  }
  io::h5::Handle configs = io::h5::open_group(f, "configs");
  const std::size_t K = eval::length_bucket_edges(N).size() - 1;
  for (const auto& [name, policy] : std::vector<std::pair<std::string, std::string>>{
           {"shared:nvfp4+sr@4", "shared:nvfp4+sr@4"}, {"split:nvfp4+rtn|fp32@4", "split:nvfp4+rtn/fp32@4"}}) {
    CAPTURE(name);
    io::h5::Handle g = io::h5::open_group(configs, name);
    CHECK(io::h5::read_attr_string(g, "policy") == policy);
    CHECK(io::h5::read_attr_int(g, "complete") == 1);
    const auto cj = nlohmann::json::parse(io::h5::read_attr_string(g, "config"));
    CHECK(cj["window"] == 4);
    CHECK(cj["n_positions"] == N);
    CHECK(cj["books"] == nlohmann::json::array({"book00", "book01"}));
    std::vector<hsize_t> dims;
    const auto kl = io::h5::read_dataset<float>(g, "kl", &dims);
    CHECK(dims == std::vector<hsize_t>{2, static_cast<hsize_t>(N)});
    io::h5::read_dataset<double>(g, "bucket_mean", &dims);
    CHECK(dims == std::vector<hsize_t>{2, K});
    io::h5::read_dataset<double>(g, "percentiles", &dims);
    CHECK(dims == std::vector<hsize_t>{2, 5});
    CHECK(io::h5::read_row(g, "kl", 1) == std::vector<float>(kl.begin() + N, kl.end()));

    // Direct computation from the model for book 1.
    const std::span<const int32_t> in(books[1].tokens.data(), static_cast<std::size_t>(N));
    const auto h_ref = model.final_hidden(in, ssm::PrecisionPolicy::parse("conv:fp32"));
    const auto h_cfg = model.final_hidden(in, ssm::PrecisionPolicy::parse(policy));
    const auto lr = model.log_probs(h_ref), lc = model.log_probs(h_cfg);
    double sum = 0, max_kl = 0;
    for (int64_t t = 0; t < N; ++t) {
      const double d = direct_kl(lr.row(t).data(), lc.row(t).data(), model.vocab_size());
      CHECK(kl[static_cast<std::size_t>(N + t)] == doctest::Approx(d).epsilon(1e-6));
      sum += d;
      max_kl = std::max(max_kl, d);
    }
    const auto mean = io::h5::read_dataset<double>(g, "mean_kl");
    CHECK(mean[1] == doctest::Approx(sum / N).epsilon(1e-9));
    CHECK(sum > 0);  // low-precision state does change the distributions
    const auto pct = io::h5::read_dataset<double>(g, "percentiles");
    CHECK(pct[5 + 4] == doctest::Approx(max_kl).epsilon(1e-6));

    // The aggregate pools both books.
    io::h5::Handle a = io::h5::open_group(g, "aggregate");
    const auto bsum = io::h5::read_dataset<double>(g, "bucket_sum");
    const auto bcount = io::h5::read_dataset<int64_t>(g, "bucket_count");
    const auto asum = io::h5::read_dataset<double>(a, "bucket_sum");
    const auto amean = io::h5::read_dataset<double>(a, "bucket_mean");
    for (std::size_t k = 0; k < K; ++k) {
      CHECK(asum[k] == doctest::Approx(bsum[k] + bsum[K + k]).epsilon(1e-12));
      CHECK(amean[k] == doctest::Approx((bsum[k] + bsum[K + k]) / double(bcount[k] + bcount[K + k])).epsilon(1e-12));
    }
    CHECK(io::h5::read_dataset<int64_t>(a, "nonfinite_positions")[0] == 0);
    CHECK(io::h5::read_dataset<int64_t>(a, "positions")[0] == 2 * N);
  }
  {  // conv:fp32 against itself: KL exactly 0 everywhere, top-1 always agrees.
    io::h5::Handle g = io::h5::open_group(configs, "conv:fp32");
    for (float v : io::h5::read_dataset<float>(g, "kl")) CHECK(v == 0.0f);
    CHECK(io::h5::read_dataset<double>(g, "top1") == std::vector<double>{1.0, 1.0});
  }
  // The reader used for resume checks and the summary table.
  const eval::ResultsSummary s = eval::read_results_summary((dir / "res.h5").string());
  CHECK(s.complete);
  REQUIRE(s.configs.size() == 3);
  CHECK(s.configs[1].policy == "split:nvfp4+rtn/fp32@4");
  CHECK(s.configs[1].aggregate.mean_kl() == doctest::Approx(r.rows[1].stats.mean_kl()).epsilon(1e-12));
  fs::remove_all(dir);
}

TEST_CASE("an interrupted sweep resumes: finished cells are skipped and the result is identical") {
  const fs::path dir = fresh_dir("resume");
  TinySsmModel model({});
  const int64_t N = 150;
  const auto books = make_books(2, N + 1, model.vocab_size(), 12);
  const std::vector<std::string> specs = {"shared:nvfp4+sr", "split:nvfp4+rtn/fp16+sr", "shared:fp16+rtn"};

  eval::run_kl_sweep(model, books, options(dir / "whole.h5", N, specs));

  model.reset_counters();
  model.fail_after_forwards(4);  // book 0: reference + 3 configurations, then book 1's reference fails
  auto o = options(dir / "res.h5", N, specs);
  CHECK_THROWS_WITH(eval::run_kl_sweep(model, books, o), doctest::Contains("simulated interruption"));
  CHECK_FALSE(fs::exists(dir / "res.h5"));
  const fs::path work = dir / ".res.h5.parts";
  REQUIRE(fs::exists(work));
  CHECK(listing(work) == std::vector<std::string>{"c0000-b00000.h5", "c0001-b00000.h5", "c0002-b00000.h5",
                                                  "sweep.json"});
  // Temporaries of a killed run are cleaned up by the next one.
  std::ofstream(dir / ".res.h5.tmp-999999") << "partial";
  std::ofstream(work / ".c0000-b00001.h5.tmp-999999") << "partial";

  model.reset_counters();
  std::ostringstream log;
  o.log = &log;
  const eval::SweepOutcome r = eval::run_kl_sweep(model, books, o);
  CHECK(r.cells_resumed == 3);
  CHECK(r.cells_run == 3);
  CHECK(model.forward_calls() == 1 + 3);  // book 0 is not run again, not even its reference
  CHECK(log.str().find("resuming: 3 of 6") != std::string::npos);
  CHECK(log.str().find("removed") != std::string::npos);
  CHECK(listing(dir) == std::vector<std::string>{"res.h5", "whole.h5"});

  io::h5::Handle a = io::h5::open_file((dir / "whole.h5").string());
  io::h5::Handle b = io::h5::open_file((dir / "res.h5").string());
  for (const char* g : {"configs/shared:nvfp4+sr@4", "configs/split:nvfp4+rtn|fp16+sr@4", "configs/shared:fp16+rtn@4"}) {
    CAPTURE(g);
    io::h5::Handle ga = io::h5::open_group(a, g), gb = io::h5::open_group(b, g);
    CHECK(io::h5::read_dataset<float>(ga, "kl") == io::h5::read_dataset<float>(gb, "kl"));
    CHECK(io::h5::read_dataset<double>(ga, "bucket_sum") == io::h5::read_dataset<double>(gb, "bucket_sum"));
    CHECK(io::h5::read_dataset<double>(ga, "aggregate/percentiles") ==
          io::h5::read_dataset<double>(gb, "aggregate/percentiles"));
  }
  CHECK(io::h5::read_attr_string(a, "sweep") == io::h5::read_attr_string(b, "sweep"));
  fs::remove_all(dir);
}

TEST_CASE("existing results: same settings -> nothing to do; different -> refused unless --force") {
  const fs::path dir = fresh_dir("force");
  TinySsmModel model({});
  const int64_t N = 100;
  const auto books = make_books(1, N + 1, model.vocab_size(), 13);
  const fs::path out = dir / "res.h5";
  eval::run_kl_sweep(model, books, options(out, N, {"shared:nvfp4+sr"}));
  const std::string before = file_bytes(out);

  model.reset_counters();
  const eval::SweepOutcome same = eval::run_kl_sweep(model, books, options(out, N, {"shared:nvfp4+sr"}));
  CHECK(same.already_complete);
  CHECK(same.cells_run == 0);
  CHECK(model.forward_calls() == 0);
  REQUIRE(same.rows.size() == 1);
  CHECK(same.rows[0].policy == "shared:nvfp4+sr@4");
  CHECK(file_bytes(out) == before);

  // A configuration added between runs.
  CHECK_THROWS_WITH(eval::run_kl_sweep(model, books, options(out, N, {"shared:nvfp4+sr", "shared:fp16+sr"})),
                    doctest::Contains("configurations: added shared:fp16+sr@4"));
  // A different length, a different model.
  CHECK_THROWS_WITH(eval::run_kl_sweep(model, books, options(out, N - 1, {"shared:nvfp4+sr"})),
                    doctest::Contains("n_positions: 100 -> 99"));
  TinySsmModel other({.seed = 99});
  CHECK_THROWS_WITH(eval::run_kl_sweep(other, books, options(out, N, {"shared:nvfp4+sr"})),
                    doctest::Contains("--force"));
  CHECK(model.forward_calls() == 0);
  CHECK(file_bytes(out) == before);

  // --force replaces it.
  auto forced = options(out, N, {"shared:nvfp4+sr", "shared:fp16+sr"});
  forced.force = true;
  const eval::SweepOutcome f = eval::run_kl_sweep(model, books, forced);
  CHECK(f.cells_run == 2);
  CHECK(eval::read_results_summary(out.string()).configs.size() == 2);

  // Something that is not a result file is not overwritten either.
  const fs::path notes = dir / "notes.h5";
  std::ofstream(notes) << "my notes";
  CHECK_THROWS_WITH(eval::run_kl_sweep(model, books, options(notes, N, {"shared:nvfp4+sr"})),
                    doctest::Contains("not a readable kl-sweep result file"));
  CHECK(file_bytes(notes) == "my notes");

  // Partial results of a different sweep are not mixed in.
  model.reset_counters();
  model.fail_after_forwards(2);
  CHECK_THROWS(eval::run_kl_sweep(model, books, options(dir / "p.h5", N, {"shared:nvfp4+sr", "shared:fp16+sr"})));
  model.reset_counters();
  CHECK_THROWS_WITH(eval::run_kl_sweep(model, books, options(dir / "p.h5", N, {"shared:nvfp4+sr"})),
                    doctest::Contains("interrupted sweep with different settings"));
  auto discard = options(dir / "p.h5", N, {"shared:nvfp4+sr"});
  discard.force = true;
  CHECK(eval::run_kl_sweep(model, books, discard).cells_run == 1);
  CHECK_FALSE(fs::exists(dir / ".p.h5.parts"));

  // An interrupted forced run (replacing res.h5 by a different sweep) resumes when run again.
  auto forced2 = options(out, N, {"shared:nvfp4+sr", "shared:fp16+sr", "shared:fp16+rtn"});
  forced2.force = true;
  model.reset_counters();
  model.fail_after_forwards(3);  // reference + 2 cells of the one book
  CHECK_THROWS(eval::run_kl_sweep(model, books, forced2));
  CHECK(eval::read_results_summary(out.string()).configs.size() == 2);  // the old result is intact
  model.reset_counters();
  const eval::SweepOutcome resumed = eval::run_kl_sweep(model, books, forced2);
  CHECK(resumed.cells_resumed == 2);
  CHECK(resumed.cells_run == 1);
  CHECK(eval::read_results_summary(out.string()).configs.size() == 3);
  fs::remove_all(dir);
}

TEST_CASE("a second sweep on the same output is stopped by the lock") {
  const fs::path dir = fresh_dir("lock");
  TinySsmModel model({});
  const auto books = make_books(1, 51, model.vocab_size(), 14);
  const int fd = ::open((dir / ".res.h5.lock").c_str(), O_CREAT | O_RDWR, 0644);
  REQUIRE(fd >= 0);
  REQUIRE(::flock(fd, LOCK_EX | LOCK_NB) == 0);
  CHECK_THROWS_WITH(eval::run_kl_sweep(model, books, options(dir / "res.h5", 50, {"shared:nvfp4+sr"})),
                    doctest::Contains("another kl-sweep"));
  ::close(fd);
  CHECK(eval::run_kl_sweep(model, books, options(dir / "res.h5", 50, {"shared:nvfp4+sr"})).cells_run == 1);
  fs::remove_all(dir);
}

TEST_CASE("an overflowing state gives NaN positions: counted, stored, excluded, never fatal") {
  const fs::path dir = fresh_dir("nan");
  TinySsmModel model({.v_scale = 3e5f});
  const int64_t N = 256;
  const auto books = make_books(2, N + 1, model.vocab_size(), 15);
  auto o = options(dir / "res.h5", N, {"conv:fp16+rtn", "split:nvfp4+rtn/fp32"});
  std::ostringstream log;
  o.log = &log;
  const eval::SweepOutcome r = eval::run_kl_sweep(model, books, o);
  REQUIRE(r.rows.size() == 2);
  const eval::KlStats& fp16 = r.rows[0].stats;
  CHECK(fp16.nonfinite_positions > 0);
  CHECK(fp16.nonfinite_values > 0);
  CHECK(fp16.finite_positions + fp16.nonfinite_positions == 2 * N);
  CHECK(fp16.ref_nonfinite_positions == 0);
  if (fp16.finite_positions > 0) CHECK(std::isfinite(fp16.mean_kl()));
  CHECK(r.rows[1].stats.nonfinite_positions == 0);
  CHECK(log.str().find("non-finite (first at position") != std::string::npos);
  io::h5::Handle f = io::h5::open_file((dir / "res.h5").string());
  io::h5::Handle g = io::h5::open_group(f, "configs/conv:fp16+rtn");
  int64_t stored_nan = 0;
  for (float v : io::h5::read_dataset<float>(g, "kl")) stored_nan += !std::isfinite(v);
  CHECK(stored_nan == fp16.nonfinite_positions);
  const auto per_book = io::h5::read_dataset<int64_t>(g, "nonfinite_positions");
  CHECK(per_book[0] + per_book[1] == fp16.nonfinite_positions);
  CHECK(eval::format_summary_table(r.rows).find("%)") != std::string::npos);
  fs::remove_all(dir);
}

TEST_CASE("bad inputs are refused before any work, with messages for the command line") {
  const fs::path dir = fresh_dir("inputs");
  TinySsmModel model({});
  auto books = make_books(1, 40, model.vocab_size(), 16);
  CHECK_THROWS_WITH(eval::run_kl_sweep(model, books, options(dir / "r.h5", 40, {"shared:nvfp4+sr"})),
                    doctest::Contains("needs 41 (N + 1)"));
  books[0].tokens[3] = model.vocab_size();
  CHECK_THROWS_WITH(eval::run_kl_sweep(model, books, options(dir / "r.h5", 20, {"shared:nvfp4+sr"})),
                    doctest::Contains("outside the model's vocabulary"));
  books[0].tokens[3] = 0;
  CHECK_THROWS_WITH(eval::run_kl_sweep(model, books, options(dir / "r.h5", 0, {"shared:nvfp4+sr"})),
                    doctest::Contains("at least 1"));
  auto none = options(dir / "r.h5", 20, {});
  CHECK_THROWS_WITH(eval::run_kl_sweep(model, books, none), doctest::Contains("no configuration"));
  CHECK(model.forward_calls() == 0);
  CHECK(listing(dir).empty());
  fs::remove_all(dir);
}

namespace {

// A PID no process has: a child that has exited and been reaped.
long dead_pid() {
  const pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  ::waitpid(child, nullptr, 0);
  return static_cast<long>(child);
}

struct FileId {
  ino_t inode;
  timespec mtime;
  bool operator==(const FileId& o) const {
    return inode == o.inode && mtime.tv_sec == o.mtime.tv_sec && mtime.tv_nsec == o.mtime.tv_nsec;
  }
};
FileId file_id(const fs::path& p) {
  struct stat st {};
  REQUIRE(::stat(p.c_str(), &st) == 0);
  return {st.st_ino, st.st_mtim};
}

}  // namespace

TEST_CASE("sweeps on px.h5 and px.h5.2 in one folder never remove each other's temporaries") {
  // Issue 17 defect 5: the stale-temporary clean-up of px.h5 matched the prefix ".px.h5" and
  // deleted the live temporary of a concurrent sweep writing px.h5.2.
  const fs::path dir = fresh_dir("prefix");
  TinySsmModel model({});
  const int64_t N = 60;
  const auto books = make_books(1, N + 1, model.vocab_size(), 18);
  const long dead = dead_pid();
  const std::string live = std::to_string(static_cast<long>(::getppid()));  // the test runner's parent is alive
  // The other sweep (px.h5.2) in the middle of its run: its lock, work directory, a cell being
  // written and its result temporary; plus the leftovers of a killed run of each output.
  const std::vector<std::string> others = {".px.h5.2.tmp-" + live, ".px.h5.2.tmp-" + std::to_string(dead),
                                           ".px.h5.2.lock", ".px.h5.2.parts", ".px.h5.tmp-" + live};
  for (const auto& n : others) std::ofstream(dir / n) << "another writer";
  fs::remove(dir / ".px.h5.2.parts");
  fs::create_directories(dir / ".px.h5.2.parts");
  std::ofstream(dir / ".px.h5.2.parts" / (".c0000-b00000.h5.tmp-" + live)) << "partial";
  std::ofstream(dir / ".px.h5.2.parts" / (".c0000-b00001.h5.tmp-" + std::to_string(dead))) << "stale";
  std::ofstream(dir / (".px.h5.tmp-" + std::to_string(dead))) << "stale temporary of px.h5";

  std::ostringstream log;
  auto o = options(dir / "px.h5", N, {"shared:nvfp4+sr", "shared:fp16+sr"});
  o.log = &log;
  model.fail_after_forwards(2);  // interrupted after its first cell: work dir and cells exist
  CHECK_THROWS(eval::run_kl_sweep(model, books, o));
  std::ofstream(dir / ".px.h5.parts" / (".c0001-b00000.h5.tmp-" + std::to_string(dead))) << "stale cell";
  model.reset_counters();
  CHECK(eval::run_kl_sweep(model, books, o).cells_run == 1);

  // Its own stale temporaries (dead PID, exact name) are gone; everything of px.h5.2 and the live
  // temporary stay, byte for byte.
  CHECK_FALSE(fs::exists(dir / (".px.h5.tmp-" + std::to_string(dead))));
  CHECK_FALSE(fs::exists(dir / ".px.h5.parts"));
  for (const auto& n : {".px.h5.2.tmp-" + live, ".px.h5.2.tmp-" + std::to_string(dead), std::string(".px.h5.2.lock"),
                        ".px.h5.tmp-" + live}) {
    CAPTURE(n);
    CHECK(file_bytes(dir / n) == "another writer");
  }
  CHECK(file_bytes(dir / ".px.h5.2.parts" / (".c0000-b00000.h5.tmp-" + live)) == "partial");
  CHECK(file_bytes(dir / ".px.h5.2.parts" / (".c0000-b00001.h5.tmp-" + std::to_string(dead))) == "stale");
  CHECK(log.str().find(".px.h5.2") == std::string::npos);
  CHECK(log.str().find("removed " + (dir / (".px.h5.tmp-" + std::to_string(dead))).string()) != std::string::npos);
  // Every file this sweep wrote went through a temporary named after it: nothing else is left.
  // (sorted like listing(): the two PIDs' digits decide the order of the px.h5.2 temporaries)
  std::vector<std::string> expected = {".px.h5.2.lock", ".px.h5.2.parts", ".px.h5.2.tmp-" + live,
                                       ".px.h5.2.tmp-" + std::to_string(dead), ".px.h5.tmp-" + live, "px.h5"};
  std::sort(expected.begin(), expected.end());
  CHECK(listing(dir) == expected);
  fs::remove_all(dir);
}

TEST_CASE("a finished result is reported without the lock and without writing anything") {
  // Issue 17 defect 12: on a read-only filesystem the summary failed with "cannot create lock
  // file". The complete-result path now takes no lock: shown here with a lock path that cannot be
  // created (a directory of that name), and by checking that nothing in the folder changes.
  // tests/python/test_sweep_io_faults.py runs the same on a read-only bind mount.
  const fs::path dir = fresh_dir("readonly");
  TinySsmModel model({});
  const int64_t N = 80;
  const auto books = make_books(2, N + 1, model.vocab_size(), 19);
  const auto o = options(dir / "res.h5", N, {"shared:nvfp4+sr", "split:nvfp4+rtn/fp32"});
  const eval::SweepOutcome first = eval::run_kl_sweep(model, books, o);
  fs::create_directory(dir / ".res.h5.lock");  // FileLock would fail: "cannot create lock file"
  const FileId before = file_id(dir / "res.h5");
  const std::string bytes = file_bytes(dir / "res.h5");
  const auto entries_before = listing(dir);

  model.reset_counters();
  const eval::SweepOutcome again = eval::run_kl_sweep(model, books, o);
  CHECK(again.already_complete);
  CHECK(again.cells_run == 0);
  CHECK(model.forward_calls() == 0);
  REQUIRE(again.rows.size() == 2);
  CHECK(again.rows[1].policy == "split:nvfp4+rtn/fp32@4");
  CHECK(again.rows[1].stats.mean_kl() == doctest::Approx(first.rows[1].stats.mean_kl()).epsilon(1e-12));
  CHECK(again.rows[1].stats.finite_positions == first.rows[1].stats.finite_positions);
  CHECK(listing(dir) == entries_before);
  CHECK(fs::is_empty(dir / ".res.h5.lock"));
  CHECK(file_id(dir / "res.h5") == before);
  CHECK(file_bytes(dir / "res.h5") == bytes);

  // What does need the lock still asks for it: a different sweep with --force.
  auto forced = options(dir / "res.h5", N, {"shared:nvfp4+sr"});
  forced.force = true;
  CHECK_THROWS_WITH(eval::run_kl_sweep(model, books, forced), doctest::Contains("cannot create lock file"));
  CHECK(file_bytes(dir / "res.h5") == bytes);

  // A work directory left by a run that died after its final rename is removed when the lock can
  // be had, and only noted when it cannot.
  fs::create_directories(dir / ".res.h5.parts");
  std::ostringstream log;
  auto logged = o;
  logged.log = &log;
  CHECK(eval::run_kl_sweep(model, books, logged).already_complete);
  CHECK(fs::exists(dir / ".res.h5.parts"));
  CHECK(log.str().find("could not remove") != std::string::npos);
  fs::remove(dir / ".res.h5.lock");
  CHECK(eval::run_kl_sweep(model, books, o).already_complete);
  CHECK_FALSE(fs::exists(dir / ".res.h5.parts"));
  CHECK(listing(dir) == std::vector<std::string>{"res.h5"});
  fs::remove_all(dir);
}

TEST_CASE("hostile outputs and work directories: refused or recomputed, never mixed in") {
  const fs::path dir = fresh_dir("hostile");
  TinySsmModel model({});
  const int64_t N = 50;
  const auto books = make_books(2, N + 1, model.vocab_size(), 20);
  const std::vector<std::string> specs = {"shared:nvfp4+sr", "shared:fp16+sr"};

  // --out is a directory.
  fs::create_directories(dir / "adir.h5");
  CHECK_THROWS_WITH(eval::run_kl_sweep(model, books, options(dir / "adir.h5", N, specs)),
                    doctest::Contains("adir.h5 is a directory"));
  // --out in a missing directory: created (like mkdir -p), the result written there.
  CHECK(eval::run_kl_sweep(model, books, options(dir / "new" / "sub" / "r.h5", N, specs)).cells_run == 4);
  CHECK(listing(dir / "new" / "sub") == std::vector<std::string>{"r.h5"});
  // A truncated result file is not mistaken for a result, nor overwritten without --force.
  const std::string whole = file_bytes(dir / "new" / "sub" / "r.h5");
  std::ofstream(dir / "cut.h5", std::ios::binary).write(whole.data(), static_cast<std::streamsize>(whole.size() / 2));
  CHECK_THROWS_WITH(eval::run_kl_sweep(model, books, options(dir / "cut.h5", N, specs)),
                    doctest::Contains("cut.h5 exists and is not a readable kl-sweep result file"));
  CHECK(fs::file_size(dir / "cut.h5") == whole.size() / 2);
  // A cell file of this sweep's parts: another sweep's cell copied in, a corrupted one, one of
  // another length. Each is recomputed, and the result equals an undisturbed run's.
  model.reset_counters();
  model.fail_after_forwards(3);  // book 0: reference + both configurations
  auto o = options(dir / "res.h5", N, specs);
  std::ostringstream log;
  o.log = &log;
  CHECK_THROWS(eval::run_kl_sweep(model, books, o));
  const fs::path work = dir / ".res.h5.parts";
  REQUIRE(fs::exists(work / "c0000-b00000.h5"));
  model.reset_counters();
  model.fail_after_forwards(2);  // another sweep (N - 1) in another folder leaves its cells too
  CHECK_THROWS(eval::run_kl_sweep(model, books, options(dir / "other" / "res.h5", N - 1, specs)));
  fs::copy_file(dir / "other" / ".res.h5.parts" / "c0000-b00000.h5", work / "c0000-b00001.h5");
  {
    const std::string cell = file_bytes(work / "c0001-b00000.h5");
    std::ofstream(work / "c0001-b00000.h5", std::ios::binary).write(cell.data(), 100);  // truncated
  }
  model.reset_counters();
  const eval::SweepOutcome r = eval::run_kl_sweep(model, books, o);
  CHECK(r.cells_resumed == 1);  // only c0000-b00000 is this sweep's and whole
  CHECK(r.cells_run == 3);
  CHECK(log.str().find("c0000-b00001.h5 belongs to another sweep") != std::string::npos);
  CHECK(log.str().find("c0001-b00000.h5: cannot open") != std::string::npos);
  const auto undisturbed = eval::read_results_summary((dir / "new" / "sub" / "r.h5").string());
  const auto resumed = eval::read_results_summary((dir / "res.h5").string());
  REQUIRE(resumed.configs.size() == 2);
  for (std::size_t c = 0; c < 2; ++c) {
    CHECK(resumed.configs[c].aggregate.bucket_sum == undisturbed.configs[c].aggregate.bucket_sum);
    CHECK(resumed.configs[c].aggregate.pct.value == undisturbed.configs[c].aggregate.pct.value);
  }
  fs::remove_all(dir);
}

TEST_CASE("the result records the build's host ISA, outside the sweep identity") {
  const fs::path dir = fresh_dir("isa");
  TinySsmModel model({});
  const auto books = make_books(1, 41, model.vocab_size(), 21);
  const auto o = options(dir / "res.h5", 40, {"shared:nvfp4+sr"});
  eval::run_kl_sweep(model, books, o);
  io::h5::Handle f = io::h5::open_file((dir / "res.h5").string());
  CHECK(io::h5::read_attr_string(f, "host_isa") == build_host_isa());
  CHECK(eval::read_results_summary((dir / "res.h5").string()).meta.host_isa == build_host_isa());
  CHECK_FALSE(eval::sweep_identity(model, books, o).contains("host_isa"));
  fs::remove_all(dir);
}

// Writes a small result file for tests/python (h5py reads it back and plots it). Skipped in a
// normal run; pytest runs it as
//   REPLAYSSM_SAMPLE_RESULTS=sample.h5 test_eval --no-skip -tc="sample result file*"
TEST_CASE("sample result file for the Python tests" * doctest::skip()) {
  const char* path = std::getenv("REPLAYSSM_SAMPLE_RESULTS");
  REQUIRE(path != nullptr);
  TinySsmModel model({.v_scale = 2e4f});
  const int64_t N = 600;
  const auto books = make_books(2, N + 1, model.vocab_size(), 17);
  auto o = options(path, N,
                   {"shared:fp16+sr", "shared:fp16+rtn", "shared:nvfp4+sr", "shared:nvfp4+rtn", "split:nvfp4+rtn/fp32",
                    "split:nvfp4+rtn/fp16+sr", "conv:fp16+rtn"},
                   {4, 16});
  o.force = true;
  const eval::SweepOutcome r = eval::run_kl_sweep(model, books, o);
  CHECK(r.cells_run == static_cast<int64_t>(2 * o.policies.size()));
}

namespace {
// An engine computing "below FP32": the CPU engine, but its reference runs under `regime` (a
// stand-in for BF16 compute), and its noise floor compares the reference policy as given (the FP32
// compute) with the reference under `regime`.
class LowComputeEngine final : public eval::SweepEngine {
 public:
  LowComputeEngine(model::TeacherForcedModel& m, ssm::PrecisionPolicy regime)
      : cpu_(eval::make_cpu_engine(m, 1)), regime_(regime), m_(m) {}
  const model::TeacherForcedModel& model() const override { return m_; }
  std::string device() const override { return "test"; }
  std::string compute() const override { return "low"; }
  void set_reference(std::span<const int32_t> input, const ssm::PrecisionPolicy& policy) override {
    reference_ = policy;
    input_.assign(input.begin(), input.end());
    cpu_->set_reference(input, regime_);
  }
  eval::CompareTimes compare(const ssm::PrecisionPolicy& p, std::span<const int32_t> t, int chunk,
                             const eval::CompareCallbacks& cb) override {
    return cpu_->compare(p, t, chunk, cb);
  }
  eval::CompareTimes compare_compute_noise_floor(std::span<const int32_t> t, int chunk,
                                                 const eval::CompareCallbacks& cb) override {
    ++noise_floor_calls;
    const auto fp32 = eval::make_cpu_engine(m_, 1);
    fp32->set_reference(input_, reference_);
    return fp32->compare(regime_, t, chunk, cb);
  }
  int noise_floor_calls = 0;

 private:
  std::unique_ptr<eval::SweepEngine> cpu_;
  ssm::PrecisionPolicy regime_, reference_;
  std::vector<int32_t> input_;
  model::TeacherForcedModel& m_;
};
}  // namespace

TEST_CASE("below FP32 compute the sweep stores the compute noise floor beside the configurations, and resumes it") {
  const fs::path dir = fresh_dir("noise_floor");
  TinySsmModel model({});
  const int64_t N = 96;
  const auto books = make_books(2, N + 3, model.vocab_size(), 29);
  const auto o = options(dir / "nf.h5", N, {"shared:nvfp4+sr"});
  const ssm::PrecisionPolicy regime = ssm::PrecisionPolicy::parse("conv:bf16");
  LowComputeEngine engine(model, regime);
  const eval::SweepOutcome r = eval::run_kl_sweep(engine, books, o);
  CHECK(r.cells_total == 4);  // (1 configuration + the noise floor) x 2 books
  REQUIRE(r.rows.size() == 2);
  CHECK(r.rows[1].policy == "noise-floor:low-vs-fp32");
  CHECK(engine.noise_floor_calls == 2);
  // The stored noise floor is KL(reference at FP32 || reference at the low compute), computed directly.
  io::h5::Handle f = io::h5::open_file((dir / "nf.h5").string());
  const std::vector<float> kl = io::h5::read_dataset<float>(f, "configs/noise-floor:low-vs-fp32/kl");
  REQUIRE(kl.size() == static_cast<std::size_t>(2 * N));
  double worst = 0, sum = 0;
  for (std::size_t b = 0; b < books.size(); ++b) {
    const std::span<const int32_t> in(books[b].tokens.data(), static_cast<std::size_t>(N));
    const model::RowMatrixXf p = model.log_probs(model.final_hidden(in, ssm::PrecisionPolicy::parse("conv:fp32")));
    const model::RowMatrixXf q = model.log_probs(model.final_hidden(in, regime));
    for (int64_t t = 0; t < N; ++t) {
      const double want = direct_kl(p.row(t).data(), q.row(t).data(), model.vocab_size());
      // relative 1e-5, and 1e-12 absolute where the direct sum's own rounding dominates (KL ~ 0)
      worst = std::max(worst, std::abs(kl[b * N + t] - want) / (1e-5 * want + 1e-12));
      sum += want;
    }
  }
  CHECK(sum > 0);  // a real, non-zero floor
  CHECK(worst <= 1.0);
  const nlohmann::json id = nlohmann::json::parse(io::h5::read_attr_string(f, "sweep"));
  CHECK(id.at("compute") == "low");
  f = io::h5::Handle();
  // Run again: complete, nothing recomputed.
  LowComputeEngine again(model, regime);
  const eval::SweepOutcome r2 = eval::run_kl_sweep(again, books, o);
  CHECK(r2.already_complete);
  CHECK(again.noise_floor_calls == 0);
}

TEST_CASE("an FP32 engine has no compute noise floor") {
  TinySsmModel model({});
  const auto engine = eval::make_cpu_engine(model, 1);
  const std::vector<int32_t> t(8, 0);
  CHECK(test::contains(test::error_of<std::logic_error>([&] { engine->compare_compute_noise_floor(t, 4, {}); }),
                       "computes in fp32: no noise floor"));
}
