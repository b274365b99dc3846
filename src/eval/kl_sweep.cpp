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

RowMatrixXf checked_hidden(TeacherForcedModel& model, std::span<const int32_t> input, const PrecisionPolicy& policy) {
  RowMatrixXf h = model.final_hidden(input, policy);
  if (h.rows() != static_cast<Eigen::Index>(input.size()) || h.cols() != model.hidden_size())
    throw std::runtime_error(fmt::format("model.final_hidden({}) returned {}x{}, expected {}x{}", policy.to_string(),
                                         h.rows(), h.cols(), input.size(), model.hidden_size()));
  return h;
}

// One (configuration, book) cell: the configuration's forward pass, then KL against the
// reference's hidden states chunk by chunk.
CellRecord compute_cell(TeacherForcedModel& model, const RowMatrixXf& ref_hidden, std::span<const int32_t> input,
                        std::span<const int32_t> targets, const PrecisionPolicy& policy, const SweepOptions& o,
                        ProgressBar& bar, const std::string& where) {
  const auto N = static_cast<int64_t>(input.size());
  const int vocab = model.vocab_size();
  bar.set_status(fmt::format("{} | {} | forward", where, policy.to_string()));
  const double t0 = now_s();
  const RowMatrixXf h = checked_hidden(model, input, policy);
  const double t1 = now_s();
  bar.set_status(fmt::format("{} | {} | KL", where, policy.to_string()));
  CellAccumulator acc(N, length_bucket_edges(N), o.threads);
  for (int64_t p0 = 0; p0 < N; p0 += o.chunk_rows) {
    const int64_t rows = std::min<int64_t>(o.chunk_rows, N - p0);
    const RowMatrixXf lr = model.log_probs(ref_hidden.middleRows(p0, rows));
    const RowMatrixXf lc = model.log_probs(h.middleRows(p0, rows));
    if (lr.rows() != rows || lr.cols() != vocab || lc.rows() != rows || lc.cols() != vocab)
      throw std::runtime_error(fmt::format("model.log_probs returned {}x{} and {}x{} for {} rows, expected {} columns "
                                           "(vocab_size)",
                                           lr.rows(), lr.cols(), lc.rows(), lc.cols(), rows, vocab));
    acc.add_chunk(p0, lr, lc, targets.subspan(static_cast<std::size_t>(p0), static_cast<std::size_t>(rows)));
    bar.advance(rows);
  }
  CellRecord rec;
  rec.stats = acc.finish();
  rec.kl = acc.kl();
  rec.forward_seconds = t1 - t0;
  rec.kl_seconds = now_s() - t1;
  rec.toolkit_version = version_string();
  rec.host_isa = build_host_isa();
  return rec;
}

ResultsMetadata results_metadata(const TeacherForcedModel& model, const SweepOptions& o, const nlohmann::json& identity) {
  ResultsMetadata meta;
  meta.toolkit_version = version_string();
  meta.git_commit = git_commit();
  meta.host_isa = build_host_isa();
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
  const double t_start = now_s();
  std::ostream null_stream(nullptr);
  std::ostream& log = o.log ? *o.log : null_stream;
  check_inputs(model, books, o);
  const PrecisionPolicy reference = PrecisionPolicy::parse(o.reference);
  const int64_t N = o.n_positions;
  const std::size_t B = books.size(), C = o.policies.size();
  std::vector<std::string> policy_names, book_names;
  for (const auto& p : o.policies) policy_names.push_back(p.to_string());
  for (const auto& b : books) book_names.push_back(b.name);
  const nlohmann::json identity = sweep_identity(model, books, o);
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
    const RowMatrixXf ref_hidden = checked_hidden(model, input, reference);
    for (std::size_t c = 0; c < C; ++c) {
      if (store.done(c, b)) continue;
      CellRecord rec = compute_cell(model, ref_hidden, input, targets, o.policies[c], o, bar, where);
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
  outcome.rows = store.merge(results_metadata(model, o, identity), rbooks, config_jsons);
  outcome.seconds = now_s() - t_start;
  return outcome;
}

}  // namespace replayssm::eval
