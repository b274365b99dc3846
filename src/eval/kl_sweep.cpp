#include "eval/kl_sweep.h"

#include <chrono>
#include <cmath>
#include <ctime>
#include <iostream>
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
CellRecord compute_cell(SweepEngine& engine, std::span<const int32_t> targets, const PrecisionPolicy* policy,
                        const std::string& name, const SweepOptions& o, ProgressBar& bar, const std::string& where) {
  const auto N = static_cast<int64_t>(targets.size());
  CellAccumulator acc(N, length_bucket_edges(N), o.threads);
  CompareCallbacks cb;
  cb.on_phase = [&](std::string_view phase) {
    bar.set_status(fmt::format("{} | {} | {}", where, name, phase));
  };
  cb.on_results = [&](int64_t first, std::span<const PositionResult> results) {
    acc.add_results(first, results);
    bar.advance(static_cast<int64_t>(results.size()));
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
  CellStore store(o.out_path, identity, policy_names, book_names, N, log);

  SweepOutcome outcome;
  outcome.path = o.out_path;
  outcome.cells_total = static_cast<int64_t>(B * C);
  if (const auto finished = store.open(o.force)) {
    outcome.already_complete = true;
    outcome.cells_resumed = outcome.cells_total;
    for (const auto& c : finished->configs) outcome.rows.push_back({c.policy, c.aggregate});
    log << fmt::format("kl-sweep: {} is already complete for these settings ({} configurations x {} books); "
                       "nothing to do (--force recomputes it)\n",
                       o.out_path, C, B);
    outcome.seconds = now_s() - t_start;
    return outcome;
  }
  outcome.cells_resumed = store.cells_done();
  if (outcome.cells_resumed > 0)
    log << fmt::format("kl-sweep: resuming: {} of {} (configuration, book) cells were finished by an earlier run\n",
                       outcome.cells_resumed, outcome.cells_total);

  ProgressBar::Options popt;
  popt.line_interval_s = o.progress_interval_s;
  popt.interactive = o.progress == "bar" || (o.progress == "auto" && o.log == &std::cerr && stderr_is_terminal());
  const bool show_progress = o.progress != "off";
  ProgressBar bar(show_progress ? log : null_stream, (outcome.cells_total - outcome.cells_resumed) * N, popt);
  const auto note = [&](const std::string& text) {
    if (show_progress)
      bar.message(text);
    else
      log << text << "\n";
  };

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
      CellRecord rec = compute_cell(engine, targets, c < P ? &o.policies[c] : nullptr, policy_names[c], o, bar, where);
      if (rec.stats.nonfinite_positions > 0) {
        int64_t first = -1;
        for (int64_t i = 0; i < N && first < 0; ++i)
          if (!std::isfinite(rec.kl[static_cast<std::size_t>(i)])) first = i;
        note(fmt::format("kl-sweep: {} on {}: {} of {} positions non-finite (first at position {}), {} non-finite "
                         "log-prob values; counted and excluded from the means",
                         policy_names[c], book.name, rec.stats.nonfinite_positions, N, first,
                         rec.stats.nonfinite_values));
      }
      store.write(c, b, std::move(rec));
      ++outcome.cells_run;
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
