#include "eval/kl_sweep.h"

#include <chrono>
#include <cmath>
#include <ctime>
#include <functional>
#include <iostream>
#include <memory>
#include <optional>
#include <set>
#include <stdexcept>

#include <fmt/format.h>

#include "eval/cell_store.h"
#include "eval/results_file.h"
#include "util/version.h"

namespace replayssm::eval {

using ssm::PrecisionPolicy;

namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::string utc_now() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

void check_inputs(const TeacherForcedModel& model, const std::vector<SweepBook>& books, const SweepOptions& o) {
  if (o.n_positions < 1) throw std::invalid_argument(fmt::format("--length must be at least 1, got {}", o.n_positions));
  if (o.policies.empty()) throw std::invalid_argument("no configuration to run: give at least one policy");
  if (books.empty()) throw std::invalid_argument("no books to run");
  if (o.chunk_rows < 1) throw std::invalid_argument(fmt::format("--chunk must be at least 1, got {}", o.chunk_rows));
  if (o.out_path.empty()) throw std::invalid_argument("no output file given (--out)");
  std::set<std::string> groups;
  for (const auto& p : o.policies)
    if (!groups.insert(config_group_name(p.to_string())).second)
      throw std::invalid_argument(fmt::format("configuration {} is listed twice", p.to_string()));
  std::set<std::string> names;
  const int vocab = model.vocab_size();
  for (const auto& b : books) {
    if (!names.insert(b.name).second) throw std::invalid_argument(fmt::format("book {} is listed twice", b.name));
    if (static_cast<int64_t>(b.tokens.size()) < o.n_positions + 1)
      throw std::invalid_argument(fmt::format("book {}: {} tokens, but --length {} needs {} (N + 1)", b.name,
                                              b.tokens.size(), o.n_positions, o.n_positions + 1));
    for (int64_t i = 0; i <= o.n_positions; ++i) {
      const int32_t t = b.tokens[static_cast<std::size_t>(i)];
      if (t < 0 || t >= vocab)
        throw std::invalid_argument(fmt::format(
            "book {}: token id {} at position {} is outside the model's vocabulary [0, {}) (tokenizer: {}): the "
            "tokens were not made for this model{}",
            b.name, t, i, vocab, o.tokenizer,
            o.tokenizer == "bytes" ? "; a byte-level model's ids may need --byte-offset" : ""));
    }
  }
}

// One (configuration, book) cell: the engine runs the configuration and compares it with the
// book's reference position by position; the accumulator keeps the per-position KL and the statistics.
// `policy` null: the compute noise floor (SweepEngine::compare_compute_noise_floor), named `name`.
// `advanced(units)`: positions compared so far in this call's last chunk.
CellRecord compute_cell(SweepEngine& engine, std::span<const int32_t> targets, const PrecisionPolicy* policy,
                        const std::string& name, const SweepOptions& o, ProgressBar& bar, const std::string& where,
                        const std::function<void(int64_t)>& advanced) {
  const auto N = static_cast<int64_t>(targets.size());
  CellAccumulator acc(N, length_bucket_edges(N), o.threads);
  CompareCallbacks cb;
  cb.on_phase = [&](std::string_view phase) {
    bar.set_status(fmt::format("{} | {} | {}", where, name, phase));
  };
  cb.on_results = [&](int64_t first, std::span<const PositionResult> results) {
    acc.add_results(first, results);
    advanced(static_cast<int64_t>(results.size()));
  };
  const CompareTimes times = policy ? engine.compare(*policy, targets, o.chunk_rows, cb)
                                    : engine.compare_compute_noise_floor(targets, o.chunk_rows, cb);
  if (!acc.complete())
    throw std::runtime_error(fmt::format("{} on {}: the engine compared {} of {} positions", name, where,
                                         acc.positions_added(), N));
  CellRecord rec;
  rec.stats = acc.finish();
  rec.kl = acc.kl();
  rec.forward_seconds = times.forward_seconds;
  rec.kl_seconds = times.kl_seconds;
  rec.toolkit_version = version_string();
  rec.host_isa = build_host_isa();
  rec.device = engine.device();
  return rec;
}

ResultsMetadata results_metadata(const SweepEngine& engine, const SweepOptions& o, const nlohmann::json& identity) {
  const TeacherForcedModel& model = engine.model();
  ResultsMetadata meta;
  meta.toolkit_version = version_string();
  meta.git_commit = git_commit();
  meta.host_isa = build_host_isa();
  meta.device = engine.device();
  meta.created = utc_now();
  meta.command_line = o.command_line;
  meta.model_description = model.description();
  meta.model_hash = model.content_hash();
  meta.model_dir = o.model_dir;
  meta.text_dir = o.text_dir;
  meta.tokens_dir = o.tokens_dir;
  meta.tokenizer = o.tokenizer;
  meta.tokenization = o.tokenization;
  meta.reference_policy = PrecisionPolicy::parse(o.reference).to_string();
  meta.sweep_json = identity.dump();
  meta.n_positions = o.n_positions;
  return meta;
}


// Per-position KL with non-finite positions: said, never fatal (docs/KL_SWEEP.md, Metrics).
void note_nonfinite(const CellRecord& rec, const std::string& policy, const std::string& book, int64_t N,
                    const std::function<void(const std::string&)>& note) {
  if (rec.stats.nonfinite_positions == 0) return;
  int64_t first = -1;
  for (int64_t i = 0; i < N && first < 0; ++i)
    if (!std::isfinite(rec.kl[static_cast<std::size_t>(i)])) first = i;
  note(fmt::format("kl-sweep: {} on {}: {} of {} positions non-finite (first at position {}), {} non-finite "
                   "log-prob values; counted and excluded from the means",
                   policy, book, rec.stats.nonfinite_positions, N, first, rec.stats.nonfinite_values));
}

// A sharded sweep, after rank 0's CellStore::open: rank 0 sends every rank its identity and map of
// finished cells (or that the result is complete). Returns true when it is; otherwise the other
// ranks have attached to the store. A rank whose inputs give another identity (other model files
// or books on its host) stops, saying what differs.
bool share_open_state(SweepTeam& team, CellStore& store, const nlohmann::json& identity, bool complete) {
  std::string bytes;
  if (team.rank() == 0)
    bytes = nlohmann::json{{"identity", identity}, {"complete", complete}, {"done", store.done_map()}}.dump();
  team.broadcast(bytes);
  if (team.rank() == 0) return complete;
  const nlohmann::json state = nlohmann::json::parse(bytes);
  if (state.at("identity") != identity)
    throw std::runtime_error(fmt::format(
        "rank {}: this process's sweep differs from rank 0's ({}): every rank must read the same model and books",
        team.rank(), describe_identity_difference(state.at("identity"), identity)));
  if (state.at("complete").get<bool>()) return true;
  store.attach(state.at("done").get<std::vector<std::vector<uint8_t>>>());
  return false;
}

// What one rank of a sharded sweep moved: references computed and sent, received (bytes, and
// the time spent waiting for them, transfer included).
struct ShardTraffic {
  int computed = 0, sent = 0, received = 0;
  double received_bytes = 0, wait_seconds = 0;
};

// This rank's tasks of the plan (sweep_team.h), in the global order.
ShardTraffic run_shard(SweepEngine& engine, const std::vector<SweepBook>& books, const SweepOptions& o,
                       const std::vector<std::string>& policy_names, CellStore& store, SweepTeam& team,
                       ProgressBar& bar, int64_t& others_seen, const std::function<void(const std::string&)>& note,
                       SweepOutcome& outcome) {
  const ShardPlan plan = plan_shards(store.done_map(), team.size());
  const int me = team.rank();
  const int64_t N = o.n_positions;
  const std::size_t P = o.policies.size(), B = books.size();
  const std::size_t floats = static_cast<std::size_t>(N) * static_cast<std::size_t>(engine.model().hidden_size());
  const PrecisionPolicy reference = PrecisionPolicy::parse(o.reference);
  // Per book: the index in plan.tasks of this rank's last cell of it (-1: none).
  std::vector<std::ptrdiff_t> last_cell(B, -1);
  for (std::size_t i = 0; i < plan.tasks.size(); ++i)
    if (plan.tasks[i].rank == me && plan.tasks[i].kind == ShardTask::Kind::cell)
      last_cell[plan.tasks[i].book] = static_cast<std::ptrdiff_t>(i);
  // Progress: rank 0's bar counts every rank's positions (others_seen: those of the other ranks
  // it has counted); the others report theirs to it.
  int64_t own_units = 0;
  const auto advanced = [&](int64_t units) {
    own_units += units;
    if (me != 0) {
      team.report_progress(own_units);
      return;
    }
    const int64_t others = team.others_progress();
    bar.advance(units + (others - others_seen));
    others_seen = others;
  };

  ShardTraffic traffic;
  std::ptrdiff_t engine_book = -1;  // the book whose reference the engine holds
  // References this rank computed that its engine will have replaced before its own cells of the
  // book (it works on another book in between): a host copy, dropped after its last cell.
  std::vector<std::shared_ptr<const std::vector<float>>> kept(B);
  for (std::size_t i = 0; i < plan.tasks.size(); ++i) {
    const ShardTask& t = plan.tasks[i];
    if (t.rank != me) continue;
    const SweepBook& book = books[t.book];
    const std::span<const int32_t> input(book.tokens.data(), static_cast<std::size_t>(N));
    const std::span<const int32_t> targets(book.tokens.data() + 1, static_cast<std::size_t>(N));
    const std::string where = fmt::format("rank {}/{} | book {}/{} {}", me, team.size(), t.book + 1, B, book.name);
    if (t.kind == ShardTask::Kind::reference) {
      bar.set_status(fmt::format("{} | reference {} | forward", where, reference.to_string()));
      engine.set_reference(input, reference);
      engine_book = static_cast<std::ptrdiff_t>(t.book);
      ++traffic.computed;
      const std::vector<int>& to = plan.receivers[t.book];
      // Does the engine take another book's reference (a reference task, or a cell of another book)
      // before this rank's last cell of this book?
      bool replaced_first = false;
      for (std::ptrdiff_t j = static_cast<std::ptrdiff_t>(i) + 1; j < last_cell[t.book] && !replaced_first; ++j)
        replaced_first = plan.tasks[static_cast<std::size_t>(j)].rank == me &&
                         plan.tasks[static_cast<std::size_t>(j)].book != t.book;
      if (to.empty() && !replaced_first) continue;
      auto hidden = std::make_shared<const std::vector<float>>(engine.reference_hidden());
      if (!to.empty()) {
        team.send_reference(t.book, hidden, to);
        traffic.sent += static_cast<int>(to.size());
      }
      if (replaced_first) kept[t.book] = std::move(hidden);
      continue;
    }
    if (engine_book != static_cast<std::ptrdiff_t>(t.book)) {
      if (kept[t.book]) {
        engine.set_reference_hidden(input, reference, *kept[t.book]);
      } else {
        bar.set_status(fmt::format("{} | waiting for the reference from rank {}", where, plan.reference_rank[t.book]));
        const double t0 = now_s();
        const std::vector<float> hidden = team.receive_reference(t.book, plan.reference_rank[t.book], floats);
        traffic.wait_seconds += now_s() - t0;
        traffic.received_bytes += static_cast<double>(hidden.size() * sizeof(float));
        ++traffic.received;
        engine.set_reference_hidden(input, reference, hidden);
      }
      engine_book = static_cast<std::ptrdiff_t>(t.book);
    }
    const std::size_t c = t.config;
    CellRecord rec = compute_cell(engine, targets, c < P ? &o.policies[c] : nullptr, policy_names[c], o, bar, where,
                                  advanced);
    note_nonfinite(rec, policy_names[c], book.name, N, note);
    store.write(c, t.book, std::move(rec));
    ++outcome.cells_run;
    if (static_cast<std::ptrdiff_t>(i) == last_cell[t.book]) kept[t.book].reset();
  }
  return traffic;
}

}  // namespace

SweepOutcome run_kl_sweep(TeacherForcedModel& model, const std::vector<SweepBook>& books, const SweepOptions& o) {
  const std::unique_ptr<SweepEngine> engine = make_cpu_engine(model, o.threads);
  return run_kl_sweep(*engine, books, o);
}

SweepOutcome run_kl_sweep(SweepEngine& engine, const std::vector<SweepBook>& books, const SweepOptions& o) {
  const double t_start = now_s();
  const TeacherForcedModel& model = engine.model();
  std::ostream null_stream(nullptr);
  std::ostream& log = o.log ? *o.log : null_stream;
  check_inputs(model, books, o);
  const PrecisionPolicy reference = PrecisionPolicy::parse(o.reference);
  const int64_t N = o.n_positions;
  // Below FP32 compute, the noise floor is one more configuration, after the policies (index P).
  const std::size_t B = books.size(), P = o.policies.size();
  const bool noise_floor = engine.compute() != "fp32";
  const std::size_t C = P + (noise_floor ? 1 : 0);
  std::vector<std::string> policy_names, book_names;
  for (const auto& p : o.policies) policy_names.push_back(p.to_string());
  if (noise_floor) policy_names.push_back(compute_noise_floor_name(engine.compute()));
  for (const auto& b : books) book_names.push_back(b.name);
  const nlohmann::json identity = sweep_identity(model, books, o, engine.compute());
  // Sharded: rank 0 opens the store (lock, resume rules, clean-up) and writes the result file; the
  // other ranks only write their cells, and print only notes about them, prefixed with their rank.
  SweepTeam* const team = o.team != nullptr && o.team->size() > 1 ? o.team : nullptr;
  const bool lead = team == nullptr || team->rank() == 0;
  std::ostream& lead_log = lead ? log : null_stream;
  CellStore store(o.out_path, identity, policy_names, book_names, N, lead_log);

  SweepOutcome outcome;
  outcome.path = o.out_path;
  outcome.cells_total = static_cast<int64_t>(B * C);
  std::optional<ResultsSummary> finished;
  if (lead) finished = store.open(o.force);
  const bool complete = team ? share_open_state(*team, store, identity, finished.has_value()) : finished.has_value();
  if (complete) {
    outcome.already_complete = true;
    outcome.cells_resumed = outcome.cells_total;
    if (finished)
      for (const auto& c : finished->configs) outcome.rows.push_back({c.policy, c.aggregate});
    lead_log << fmt::format("kl-sweep: {} is already complete for these settings ({} configurations x {} books); "
                            "nothing to do (--force recomputes it)\n",
                            o.out_path, C, B);
    outcome.seconds = now_s() - t_start;
    return outcome;
  }
  outcome.cells_resumed = store.cells_done();
  if (outcome.cells_resumed > 0)
    lead_log << fmt::format(
        "kl-sweep: resuming: {} of {} (configuration, book) cells were finished by an earlier run\n",
        outcome.cells_resumed, outcome.cells_total);

  ProgressBar::Options popt;
  popt.line_interval_s = o.progress_interval_s;
  popt.interactive = o.progress == "bar" || (o.progress == "auto" && o.log == &std::cerr && stderr_is_terminal());
  const bool show_progress = o.progress != "off" && lead;
  ProgressBar bar(show_progress ? log : null_stream, (outcome.cells_total - outcome.cells_resumed) * N, popt);
  const std::string rank_prefix = team ? fmt::format("[rank {}] ", team->rank()) : "";
  const std::function<void(const std::string&)> note = [&](const std::string& text) {
    if (show_progress)
      bar.message(rank_prefix + text);
    else
      log << (rank_prefix + text + "\n");  // one write: other ranks share the terminal (stderr is unbuffered)
  };

  if (team) {
    if (lead) {
      const ShardPlan plan = plan_shards(store.done_map(), team->size());
      int64_t references = 0;
      for (const auto& t : plan.tasks) references += t.kind == ShardTask::Kind::reference;
      note(fmt::format("kl-sweep: {} processes share the sweep: {} cells and {} book references (each computed "
                       "once, by one rank, and sent to the ranks with cells of that book); planned to take {} task "
                       "units, {} in one process",
                       team->size(), plan.tasks.size() - static_cast<std::size_t>(references), references,
                       plan.makespan, plan.tasks.size()));
    }
    int64_t others_seen = 0;
    const ShardTraffic traffic =
        run_shard(engine, books, o, policy_names, store, *team, bar, others_seen, note, outcome);
    note(fmt::format("kl-sweep: done: {} cells, {} references computed ({} sent), {} received ({:.1f} MiB, {:.2f} s "
                     "waiting for them)",
                     outcome.cells_run, traffic.computed, traffic.sent, traffic.received,
                     traffic.received_bytes / (1024.0 * 1024.0), traffic.wait_seconds));
    // Every rank's cells are on disk when finish returns; rank 0 merges them.
    const int64_t cells_run = team->finish(outcome.cells_run, [&] {
      const int64_t others = team->others_progress();
      bar.advance(others - others_seen);
      others_seen = others;
    });
    if (!lead) {
      outcome.seconds = now_s() - t_start;
      return outcome;
    }
    outcome.cells_run = cells_run;
  } else {
    // Books are the outer loop: the reference's hidden states of one book serve every configuration.
    for (std::size_t b = 0; b < B; ++b) {
      bool any = false;
      for (std::size_t c = 0; c < C; ++c) any = any || !store.done(c, b);
      if (!any) continue;
      const SweepBook& book = books[b];
      const std::span<const int32_t> input(book.tokens.data(), static_cast<std::size_t>(N));
      const std::span<const int32_t> targets(book.tokens.data() + 1, static_cast<std::size_t>(N));
      const std::string where = fmt::format("book {}/{} {}", b + 1, B, book.name);
      bar.set_status(fmt::format("{} | reference {} | forward", where, reference.to_string()));
      engine.set_reference(input, reference);
      for (std::size_t c = 0; c < C; ++c) {
        if (store.done(c, b)) continue;
        CellRecord rec = compute_cell(engine, targets, c < P ? &o.policies[c] : nullptr, policy_names[c], o, bar,
                                      where, [&bar](int64_t units) { bar.advance(units); });
        note_nonfinite(rec, policy_names[c], book.name, N, note);
        store.write(c, b, std::move(rec));
        ++outcome.cells_run;
      }
    }
  }
  bar.finish();

  std::vector<ResultsBook> rbooks;
  for (const auto& bk : books)
    rbooks.push_back({bk.name, bk.source, bk.text_fnv1a64, bk.n_tokens,
                      std::vector<int32_t>(bk.tokens.begin(), bk.tokens.begin() + N + 1)});
  std::vector<std::string> config_jsons;
  for (const auto& p : o.policies) {
    nlohmann::json cj = policy_json(p);
    cj["reference"] = reference.to_string();
    cj["n_positions"] = N;
    cj["books"] = book_names;
    config_jsons.push_back(cj.dump());
  }
  if (noise_floor)
    config_jsons.push_back(nlohmann::json{{"kind", "compute noise floor"},
                                          {"compute", engine.compute()},
                                          {"compared", fmt::format("{} at FP32 compute (p) against {} at {} compute (q), "
                                                                   "KL(p || q)",
                                                                   reference.to_string(), reference.to_string(),
                                                                   engine.compute())},
                                          {"reference", reference.to_string()},
                                          {"n_positions", N},
                                          {"books", book_names}}
                               .dump());
  outcome.rows = store.merge(results_metadata(engine, o, identity), rbooks, config_jsons);
  outcome.seconds = now_s() - t_start;
  return outcome;
}

}  // namespace replayssm::eval
