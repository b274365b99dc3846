// The sharded sweep without MPI: the plan (every unfinished cell once, one reference per book that
// needs it, placed before its cells, the receivers right), the engines' reference hand-over, and
// run_kl_sweep shared by R threads through an in-process team, whose result file must equal a
// single-process run's bit for bit, also when resumed with another R. The MPI team itself is tested
// through the CLI under mpirun (tests/python/test_mpi_sweep.py).
#include <doctest/doctest.h>

#include <boost/random/mersenne_twister.hpp>
#include <boost/random/uniform_int_distribution.hpp>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <filesystem>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include "eval/cell_store.h"
#include "eval/kl_sweep.h"
#include "sweep_books.h"
#include "eval/results_file.h"
#include "eval/sweep_team.h"
#include "io/hdf5.h"
#include "io/text_source.h"
#include "test_util.h"
#include "tiny_ssm_model.h"

using namespace replayssm;
using replayssm::test::TinySsmModel;
namespace fs = std::filesystem;

namespace {

using DoneMap = std::vector<std::vector<uint8_t>>;

DoneMap random_done(std::size_t C, std::size_t B, uint64_t seed, int percent_done) {
  boost::random::mt19937_64 rng(seed);
  boost::random::uniform_int_distribution<int> pct(0, 99);
  DoneMap d(C, std::vector<uint8_t>(B, 0));
  for (auto& row : d)
    for (auto& x : row) x = pct(rng) < percent_done ? 1 : 0;
  return d;
}

// The properties every plan must have; returns the number of tasks.
void check_plan(const DoneMap& done, int R) {
  const std::size_t C = done.size(), B = done.front().size();
  const eval::ShardPlan plan = eval::plan_shards(done, R);
  std::set<std::pair<std::size_t, std::size_t>> cells;
  std::vector<int> references(B, 0);
  std::vector<std::set<int>> cell_ranks(B);
  std::size_t unfinished = 0;
  for (std::size_t c = 0; c < C; ++c)
    for (std::size_t b = 0; b < B; ++b) unfinished += done[c][b] == 0;
  for (const auto& t : plan.tasks) {
    REQUIRE(t.rank >= 0);
    REQUIRE(t.rank < R);
    if (t.kind == eval::ShardTask::Kind::reference) {
      ++references[t.book];
      CHECK(plan.reference_rank[t.book] == t.rank);
      continue;
    }
    CHECK(done[t.config][t.book] == 0);
    CHECK(cells.insert({t.config, t.book}).second);  // once
    CHECK(references[t.book] == 1);                   // its reference comes first
    cell_ranks[t.book].insert(t.rank);
  }
  CHECK(cells.size() == unfinished);
  for (std::size_t b = 0; b < B; ++b) {
    const bool needed = !cell_ranks[b].empty();
    CHECK(references[b] == (needed ? 1 : 0));
    CHECK((plan.reference_rank[b] >= 0) == needed);
    std::set<int> want = cell_ranks[b];
    want.erase(plan.reference_rank[b]);
    CHECK(std::vector<int>(want.begin(), want.end()) == plan.receivers[b]);
  }
  // Unit tasks: no better than perfect balance, no worse than one process.
  const auto n = static_cast<int64_t>(plan.tasks.size());
  CHECK(plan.makespan * R >= n);
  CHECK(plan.makespan <= n);
}

// ---- an in-process team: R threads of one process ---------------------------------------------

struct Shared {
  explicit Shared(int ranks) : progress(static_cast<std::size_t>(ranks), 0) {}
  std::mutex m;
  std::condition_variable cv;
  std::optional<std::string> broadcast;
  std::map<std::pair<std::size_t, int>, std::shared_ptr<const std::vector<float>>> references;  // (book, to)
  std::vector<int64_t> progress;
  int finished = 0;
  int64_t cells = 0;
  int references_sent = 0;
  bool aborted = false;  // a rank failed: the others stop waiting (MPI_Abort's part)
};

class ThreadTeam final : public eval::SweepTeam {
 public:
  ThreadTeam(Shared& s, int rank, int size) : s_(s), rank_(rank), size_(size) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void broadcast(std::string& bytes) override {
    std::unique_lock lock(s_.m);
    if (rank_ == 0) {
      s_.broadcast = bytes;
      s_.cv.notify_all();
      return;
    }
    wait(lock, [&] { return s_.broadcast.has_value(); });
    bytes = *s_.broadcast;
  }
  void send_reference(std::size_t book, std::shared_ptr<const std::vector<float>> hidden,
                      const std::vector<int>& to) override {
    std::lock_guard lock(s_.m);
    for (int r : to) s_.references[{book, r}] = hidden;
    s_.references_sent += static_cast<int>(to.size());
    s_.cv.notify_all();
  }
  std::vector<float> receive_reference(std::size_t book, int, std::size_t floats) override {
    std::unique_lock lock(s_.m);
    wait(lock, [&] { return s_.references.count({book, rank_}) > 0; });
    std::vector<float> out = *s_.references.at({book, rank_});
    s_.references.erase({book, rank_});
    REQUIRE(out.size() == floats);
    return out;
  }
  void report_progress(int64_t done) override {
    std::lock_guard lock(s_.m);
    s_.progress[static_cast<std::size_t>(rank_)] = done;
  }
  int64_t others_progress() override {
    std::lock_guard lock(s_.m);
    int64_t sum = 0;
    for (std::size_t r = 1; r < s_.progress.size(); ++r) sum += s_.progress[r];
    return sum;
  }
  int64_t finish(int64_t cells_run, const std::function<void()>& waiting) override {
    std::unique_lock lock(s_.m);
    s_.cells += cells_run;
    ++s_.finished;
    s_.cv.notify_all();
    if (rank_ != 0) return cells_run;
    lock.unlock();
    if (waiting) waiting();
    lock.lock();
    wait(lock, [&] { return s_.finished == size_; });
    return s_.cells;
  }

 private:
  template <class Pred>
  void wait(std::unique_lock<std::mutex>& lock, Pred pred) {
    // A bug must fail the test, not hang it.
    if (!s_.cv.wait_for(lock, std::chrono::seconds(60), [&] { return s_.aborted || pred(); }))
      throw std::runtime_error("ThreadTeam: timed out");
    if (s_.aborted) throw std::runtime_error("ThreadTeam: another rank failed");
  }
  Shared& s_;
  int rank_, size_;
};

using replayssm::test::make_books;

eval::SweepOptions options(const fs::path& out, int64_t n) {
  eval::SweepOptions o;
  o.n_positions = n;
  for (const char* p : {"shared:nvfp4+sr@4", "split:nvfp4+rtn/fp16+sr@4", "shared:fp16+rtn@8"})
    o.policies.push_back(ssm::PrecisionPolicy::parse(p));
  o.out_path = out.string();
  o.chunk_rows = 40;
  o.threads = 1;
  o.progress = "off";
  return o;
}

// The tiny model, failing (as a killed process stops) at its `fail_at`-th forward.
class FailingModel final : public model::TeacherForcedModel {
 public:
  explicit FailingModel(int fail_at) : fail_at_(fail_at) {}
  int vocab_size() const override { return m_.vocab_size(); }
  int hidden_size() const override { return m_.hidden_size(); }
  std::string description() const override { return m_.description(); }
  std::string content_hash() const override { return m_.content_hash(); }
  model::RowMatrixXf final_hidden(std::span<const int32_t> tokens, const ssm::PrecisionPolicy& policy) override {
    if (++calls_ == fail_at_) throw std::runtime_error("FailingModel: stopped");
    return m_.final_hidden(tokens, policy);
  }
  model::RowMatrixXf log_probs(const Eigen::Ref<const model::RowMatrixXf>& hidden_rows) override {
    return m_.log_probs(hidden_rows);
  }

 private:
  TinySsmModel m_{{}};
  int fail_at_, calls_ = 0;
};

// Runs the sweep on R threads sharing one in-process team; returns rank 0's outcome. Rank
// `failing` (if any) stops at its `fail_at`-th forward; the others then stop too.
eval::SweepOutcome run_team(int R, const std::vector<eval::SweepBook>& books, const eval::SweepOptions& o,
                            Shared& shared, int failing = -1, int fail_at = 0,
                            const std::vector<eval::SweepBook>* books_of_last_rank = nullptr) {
  std::vector<eval::SweepOutcome> outcomes(static_cast<std::size_t>(R));
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(R));
  std::vector<std::thread> threads;
  for (int r = 0; r < R; ++r)
    threads.emplace_back([&, r] {
      try {
        FailingModel model(r == failing ? fail_at : -1);  // one model per rank, as one per process
        ThreadTeam team(shared, r, R);
        eval::SweepOptions mine = o;
        mine.team = &team;
        outcomes[static_cast<std::size_t>(r)] =
            eval::run_kl_sweep(model, r == R - 1 && books_of_last_rank ? *books_of_last_rank : books, mine);
      } catch (...) {
        errors[static_cast<std::size_t>(r)] = std::current_exception();
        std::lock_guard lock(shared.m);
        shared.aborted = true;
        shared.cv.notify_all();
      }
    });
  for (auto& t : threads) t.join();
  // The failing rank's own error first (the others only say that it failed).
  if (failing >= 0 && errors[static_cast<std::size_t>(failing)])
    std::rethrow_exception(errors[static_cast<std::size_t>(failing)]);
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
  return outcomes.front();
}

std::vector<float> kl_of(const fs::path& file, const std::string& group) {
  io::h5::Handle f = io::h5::open_file(file.string());
  return io::h5::read_dataset<float>(f, "configs/" + group + "/kl");
}

}  // namespace

TEST_CASE("plan_shards: every unfinished cell once, after its book's one reference, receivers exact") {
  for (int R = 1; R <= 5; ++R)
    for (const auto& [C, B] : std::vector<std::pair<std::size_t, std::size_t>>{{1, 1}, {3, 2}, {1, 4}, {7, 3}, {2, 9}})
      for (int pct : {0, 30, 90}) {
        CAPTURE(R);
        CAPTURE(C);
        CAPTURE(B);
        CAPTURE(pct);
        check_plan(random_done(C, B, 1000 * R + 10 * C + B, pct), R);
      }
}

TEST_CASE("plan_shards: one rank runs the serial order; two ranks balance the unit tasks") {
  const DoneMap none(3, std::vector<uint8_t>(2, 0));
  const eval::ShardPlan one = eval::plan_shards(none, 1);
  std::vector<std::string> order;
  for (const auto& t : one.tasks)
    order.push_back(t.kind == eval::ShardTask::Kind::reference ? fmt::format("r{}", t.book)
                                                                : fmt::format("c{}b{}", t.config, t.book));
  CHECK(order == std::vector<std::string>{"r0", "c0b0", "c1b0", "c2b0", "r1", "c0b1", "c1b1", "c2b1"});
  // 8 unit tasks on 2 ranks: the second book's reference runs while the first book's starts.
  CHECK(eval::plan_shards(none, 2).makespan == 4);
  // One configuration, two books: each rank takes a book, with no reference to send.
  const eval::ShardPlan pair = eval::plan_shards(DoneMap(1, std::vector<uint8_t>(2, 0)), 2);
  CHECK(pair.makespan == 2);
  CHECK(pair.receivers[0].empty());
  CHECK(pair.receivers[1].empty());
  CHECK(test::contains(test::error_of<std::invalid_argument>([&] { eval::plan_shards(none, 0); }), "0 ranks"));
  // docs/MPI_SWEEP.md's table: 4 books x 20 configurations on 8 ranks, 84 unit tasks in 12 (ideal 11).
  CHECK(eval::plan_shards(DoneMap(20, std::vector<uint8_t>(4, 0)), 8).makespan == 12);
  CHECK(eval::plan_shards(DoneMap(20, std::vector<uint8_t>(16, 0)), 32).makespan == 12);
}

TEST_CASE("the CPU engine hands its reference over bit for bit") {
  TinySsmModel model({});
  const auto books = make_books(1, 130, model.vocab_size(), 5);
  const std::span<const int32_t> input(books[0].tokens.data(), 128), targets(books[0].tokens.data() + 1, 128);
  const auto ref = ssm::PrecisionPolicy::parse("conv:fp32"), cfg = ssm::PrecisionPolicy::parse("shared:nvfp4+sr@4");
  const auto a = eval::make_cpu_engine(model, 1), b = eval::make_cpu_engine(model, 1);
  a->set_reference(input, ref);
  const std::vector<float> hidden = a->reference_hidden();
  CHECK(hidden.size() == static_cast<std::size_t>(128 * model.hidden_size()));
  b->set_reference_hidden(input, ref, hidden);
  CHECK(b->reference_hidden() == hidden);
  std::vector<float> ka(128), kb(128);
  eval::CompareCallbacks ca, cb;
  ca.on_results = [&](int64_t first, std::span<const eval::PositionResult> r) {
    for (std::size_t i = 0; i < r.size(); ++i) ka[static_cast<std::size_t>(first) + i] = static_cast<float>(r[i].kl);
  };
  cb.on_results = [&](int64_t first, std::span<const eval::PositionResult> r) {
    for (std::size_t i = 0; i < r.size(); ++i) kb[static_cast<std::size_t>(first) + i] = static_cast<float>(r[i].kl);
  };
  a->compare(cfg, targets, 50, ca);
  b->compare(cfg, targets, 50, cb);
  CHECK(ka == kb);
  CHECK(test::contains(test::error_of<std::invalid_argument>([&] {
                         b->set_reference_hidden(input, ref, std::span<const float>(hidden.data(), 10));
                       }),
                       "10 floats for 128 positions"));
  CHECK(test::contains(test::error_of<std::logic_error>([&] { eval::make_cpu_engine(model, 1)->reference_hidden(); }),
                       "before set_reference"));
}

TEST_CASE("a sweep shared by R threads writes the single-process result bit for bit, and resumes with another R") {
  const auto books = make_books(3, 200, 48, 11);
  const int64_t N = 190;
  const fs::path dir = test::fresh_dir("sweep_team");
  TinySsmModel model({});
  const eval::SweepOutcome single = eval::run_kl_sweep(model, books, options(dir / "single.h5", N));
  CHECK(single.cells_run == 9);

  for (int R : {2, 3, 4}) {
    CAPTURE(R);
    const fs::path out = dir / fmt::format("team{}.h5", R);
    Shared shared(R);
    const eval::SweepOutcome r = run_team(R, books, options(out, N), shared);
    CHECK(r.cells_run == 9);
    CHECK(shared.references_sent > 0);  // references were handed over, not recomputed
    REQUIRE(r.rows.size() == single.rows.size());
    for (const auto& row : single.rows) {
      const std::string group = eval::config_group_name(row.policy);
      CHECK(kl_of(out, group) == kl_of(dir / "single.h5", group));
    }
    CHECK(!fs::exists(dir / fmt::format(".team{}.h5.parts", R)));
  }

  // Interrupted with 2 ranks (rank 1 stops at its third forward), finished with 3: the same file.
  const fs::path out = dir / "resumed.h5";
  {
    Shared shared(2);
    CHECK(test::contains(test::error_of<std::runtime_error>([&] { run_team(2, books, options(out, N), shared, 1, 3); }),
                         "FailingModel: stopped"));
  }
  CHECK(fs::exists(dir / ".resumed.h5.parts"));
  CHECK(!fs::exists(out));
  Shared shared(3);
  const eval::SweepOutcome r = run_team(3, books, options(out, N), shared);
  CHECK(r.cells_resumed > 0);
  CHECK(r.cells_run == 9 - r.cells_resumed);
  for (const auto& row : single.rows) {
    const std::string group = eval::config_group_name(row.policy);
    CHECK(kl_of(out, group) == kl_of(dir / "single.h5", group));
  }
  // A rank whose books differ (other files on its host) stops the run, saying what differs.
  {
    auto other = books;
    other[1].tokens[5] ^= 1;
    other[1].text_fnv1a64 = "0000000000000000";
    Shared bad(2);
    const std::string why = test::error_of<std::runtime_error>(
        [&] { run_team(2, books, options(dir / "mismatch.h5", N), bad, 1, -1, &other); });
    CHECK(test::contains(why, "rank 1: this process's sweep differs from rank 0's"));
    CHECK(test::contains(why, "books: same names, different text or token ids"));
  }
  // Complete now: every rank finds it so, nothing runs.
  Shared again(2);
  CHECK(run_team(2, books, options(out, N), again).already_complete);
  fs::remove_all(dir);
}

TEST_CASE("a rank that does not see rank 0's work directory, or gets a map of the wrong shape, stops") {
  const fs::path dir = test::fresh_dir("sweep_team_attach");
  TinySsmModel model({});
  const auto books = make_books(2, 60, model.vocab_size(), 3);
  const eval::SweepOptions o = options(dir / "r.h5", 50);
  const nlohmann::json id = eval::sweep_identity(model, books, o);
  std::ostream quiet(nullptr);
  const std::vector<std::string> policies{"a", "b", "c"}, names{"book00", "book01"};
  eval::CellStore worker((dir / "r.h5").string(), id, policies, names, 50, quiet);
  const DoneMap none(3, std::vector<uint8_t>(2, 0));
  // No .r.h5.parts here: as on a node whose disk is not rank 0's.
  CHECK(test::contains(test::error_of<std::runtime_error>([&] { worker.attach(none); }),
                       "every rank must see the output's folder on a shared filesystem"));
  CHECK(test::contains(test::error_of<std::invalid_argument>([&] { worker.attach(DoneMap(2, {0, 0})); }),
                       "not 3 x 2"));
  // Rank 0's store opened: the worker attaches and takes the map.
  eval::CellStore lead((dir / "r.h5").string(), id, policies, names, 50, quiet);
  REQUIRE(!lead.open(false));
  DoneMap some = none;
  some[1][0] = 1;
  worker.attach(some);
  CHECK(worker.cells_done() == 1);
  CHECK(worker.done(1, 0));
  CHECK(!worker.done(0, 0));
  fs::remove_all(dir);
}
