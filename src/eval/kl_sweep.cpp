#include "eval/kl_sweep.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <set>
#include <sstream>
#include <stdexcept>

#include <fmt/format.h>

#include "io/hdf5_results.h"
#include "io/text_source.h"
#include "util/version.h"

namespace replayssm::eval {

namespace fs = std::filesystem;
using ssm::DecodeScheme;
using ssm::PrecisionPolicy;

// ---- identity ----------------------------------------------------------------------------------

nlohmann::json sweep_identity(const TeacherForcedModel& model, const std::vector<SweepBook>& books,
                              const SweepOptions& o) {
  nlohmann::json id;
  id["schema_version"] = io::kResultsSchemaVersion;
  id["reference"] = PrecisionPolicy::parse(o.reference).to_string();
  id["n_positions"] = o.n_positions;
  id["model"] = {{"hash", model.content_hash()}, {"description", model.description()}};
  id["tokenizer"] = o.tokenizer;
  nlohmann::json jb = nlohmann::json::array();
  const auto used = static_cast<std::size_t>(std::max<int64_t>(o.n_positions + 1, 0));
  for (const auto& b : books) {
    const std::size_t n = std::min(used, b.tokens.size());
    jb.push_back({{"name", b.name},
                  {"source", b.source},
                  {"text_fnv1a64", b.text_fnv1a64},
                  {"tokens_fnv1a64", io::hex64(io::fnv1a64(b.tokens.data(), n))}});
  }
  id["books"] = jb;
  nlohmann::json jc = nlohmann::json::array();
  for (const auto& p : o.policies) jc.push_back(p.to_string());
  id["configs"] = jc;
  return id;
}

std::string describe_identity_difference(const nlohmann::json& a, const nlohmann::json& b) {
  std::vector<std::string> parts;
  std::set<std::string> keys;
  if (a.is_object())
    for (auto it = a.begin(); it != a.end(); ++it) keys.insert(it.key());
  if (b.is_object())
    for (auto it = b.begin(); it != b.end(); ++it) keys.insert(it.key());
  const auto names = [](const nlohmann::json& list, const char* field) {
    std::vector<std::string> v;
    if (list.is_array())
      for (const auto& x : list) v.push_back(field ? x.value(field, std::string("?")) : x.dump());
    return v;
  };
  const auto added_removed = [](const std::vector<std::string>& old_v, const std::vector<std::string>& new_v) {
    std::vector<std::string> bits;
    std::string added, removed;
    for (const auto& x : new_v)
      if (std::find(old_v.begin(), old_v.end(), x) == old_v.end()) added += (added.empty() ? "" : ", ") + x;
    for (const auto& x : old_v)
      if (std::find(new_v.begin(), new_v.end(), x) == new_v.end()) removed += (removed.empty() ? "" : ", ") + x;
    if (!added.empty()) bits.push_back("added " + added);
    if (!removed.empty()) bits.push_back("removed " + removed);
    if (bits.empty()) bits.push_back("same entries, different order or content");
    std::string s;
    for (const auto& x : bits) s += (s.empty() ? "" : "; ") + x;
    return s;
  };
  for (const std::string& k : keys) {
    const nlohmann::json va = a.is_object() && a.contains(k) ? a[k] : nlohmann::json();
    const nlohmann::json vb = b.is_object() && b.contains(k) ? b[k] : nlohmann::json();
    if (va == vb) continue;
    if (k == "configs") {
      std::vector<std::string> old_v, new_v;
      for (const auto& x : va) old_v.push_back(x.is_string() ? x.get<std::string>() : x.dump());
      for (const auto& x : vb) new_v.push_back(x.is_string() ? x.get<std::string>() : x.dump());
      parts.push_back("configurations: " + added_removed(old_v, new_v));
    } else if (k == "books") {
      const auto old_v = names(va, "name"), new_v = names(vb, "name");
      if (old_v == new_v)
        parts.push_back("books: same names, different text or token ids");
      else
        parts.push_back("books: " + added_removed(old_v, new_v));
    } else if (k == "model") {
      parts.push_back(fmt::format("model: {} -> {}", va.is_object() ? va.value("description", "?") : va.dump(),
                                  vb.is_object() ? vb.value("description", "?") : vb.dump()) +
                      (va.is_object() && vb.is_object() && va.value("hash", "") != vb.value("hash", "")
                           ? fmt::format(" (hash {} -> {})", va.value("hash", "?"), vb.value("hash", "?"))
                           : ""));
    } else {
      parts.push_back(fmt::format("{}: {} -> {}", k, va.dump(), vb.dump()));
    }
  }
  std::string s;
  for (const auto& p : parts) s += (s.empty() ? "" : "; ") + p;
  return s;
}

// ---- the sweep ---------------------------------------------------------------------------------

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

std::string cell_file(std::size_t config, std::size_t book) { return fmt::format("c{:04}-b{:05}.h5", config, book); }

void check_inputs(const TeacherForcedModel& model, const std::vector<SweepBook>& books, const SweepOptions& o) {
  if (o.n_positions < 1) throw std::invalid_argument(fmt::format("--length must be at least 1, got {}", o.n_positions));
  if (o.policies.empty()) throw std::invalid_argument("no configuration to run: give at least one policy");
  if (books.empty()) throw std::invalid_argument("no books to run");
  if (o.chunk_rows < 1) throw std::invalid_argument(fmt::format("--chunk must be at least 1, got {}", o.chunk_rows));
  if (o.out_path.empty()) throw std::invalid_argument("no output file given (--out)");
  std::set<std::string> groups;
  for (const auto& p : o.policies)
    if (!groups.insert(io::config_group_name(p.to_string())).second)
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

}  // namespace

SweepOutcome run_kl_sweep(TeacherForcedModel& model, const std::vector<SweepBook>& books, const SweepOptions& o) {
  const double t_start = now_s();
  std::ostream null_stream(nullptr);
  std::ostream& log = o.log ? *o.log : null_stream;
  check_inputs(model, books, o);
  const PrecisionPolicy reference = PrecisionPolicy::parse(o.reference);
  const int64_t N = o.n_positions;
  const int hidden = model.hidden_size(), vocab = model.vocab_size();
  const std::vector<int64_t> edges = length_bucket_edges(N);
  const nlohmann::json identity = sweep_identity(model, books, o);
  const std::string sweep_id = io::hex64(io::fnv1a64(identity.dump()));

  const fs::path out(o.out_path);
  const fs::path dir = out.parent_path().empty() ? fs::path(".") : out.parent_path();
  const std::string name = out.filename().string();
  if (name.empty() || name == "." || name == "..")
    throw std::invalid_argument(fmt::format("--out {}: not a file name", o.out_path));
  fs::create_directories(dir);
  if (fs::exists(out) && fs::is_directory(out))
    throw std::runtime_error(fmt::format("--out {} is a directory", o.out_path));
  io::FileLock lock((dir / ("." + name + ".lock")).string(), "kl-sweep");
  io::remove_stale_temps(dir.string(), name, log, "kl-sweep");
  const fs::path work = dir / ("." + name + ".parts");

  SweepOutcome outcome;
  outcome.path = o.out_path;
  const std::size_t B = books.size(), C = o.policies.size();
  outcome.cells_total = static_cast<int64_t>(B * C);

  if (fs::exists(out) && !o.force) {
    io::ResultsSummary s;
    try {
      s = io::read_results_summary(out.string());
    } catch (const std::exception& e) {
      throw std::runtime_error(fmt::format(
          "{} exists and is not a readable kl-sweep result file ({}); use --force to overwrite it, or --out to "
          "write elsewhere",
          o.out_path, e.what()));
    }
    nlohmann::json old_id;
    try {
      old_id = nlohmann::json::parse(s.meta.sweep_json);
    } catch (const std::exception&) {
      old_id = nlohmann::json();
    }
    if (old_id != identity)
      throw std::runtime_error(fmt::format(
          "{} already holds the results of a different sweep ({}); use --force to replace it, or --out to write "
          "elsewhere",
          o.out_path, describe_identity_difference(old_id, identity)));
    std::error_code ec;
    fs::remove_all(work, ec);  // a run that died between the final rename and the clean-up
    outcome.already_complete = true;
    outcome.cells_resumed = outcome.cells_total;
    for (const auto& c : s.configs) outcome.rows.push_back({c.policy, c.aggregate});
    log << fmt::format("kl-sweep: {} is already complete for these settings ({} configurations x {} books); "
                       "nothing to do (--force recomputes it)\n",
                       o.out_path, C, B);
    outcome.seconds = now_s() - t_start;
    return outcome;
  }

  if (fs::exists(work)) {
    // Partial results of the same sweep are resumed, with or without --force (force is about
    // replacing a different result; delete the work directory to recompute everything).
    nlohmann::json old_id;
    std::string unreadable;
    try {
      old_id = nlohmann::json::parse(io::read_file((work / "sweep.json").string()));
    } catch (const std::exception& e) {
      unreadable = e.what();
    }
    if (!unreadable.empty() || old_id != identity) {
      if (o.force) {
        fs::remove_all(work);
        log << fmt::format("kl-sweep: --force: discarded the partial results of a different sweep in {}\n",
                           work.string());
      } else if (!unreadable.empty()) {
        throw std::runtime_error(fmt::format(
            "{} holds the partial results of an interrupted sweep but its sweep.json is unreadable ({}); use --force "
            "to discard them",
            work.string(), unreadable));
      } else {
        throw std::runtime_error(fmt::format(
            "an interrupted sweep with different settings left partial results for {} in {} ({}); use --force to "
            "discard them, or --out to write elsewhere",
            o.out_path, work.string(), describe_identity_difference(old_id, identity)));
      }
    }
  }
  fs::create_directories(work);
  if (!fs::exists(work / "sweep.json")) io::write_file_atomically((work / "sweep.json").string(), identity.dump(2) + "\n");
  io::remove_stale_temps(work.string(), "", log, "kl-sweep");

  // Finished cells.
  std::vector<std::vector<uint8_t>> done(C, std::vector<uint8_t>(B, 0));
  for (std::size_t c = 0; c < C; ++c)
    for (std::size_t b = 0; b < B; ++b) {
      const fs::path p = work / cell_file(c, b);
      if (!fs::exists(p)) continue;
      try {
        const io::CellRecord r = io::read_cell(p.string());
        if (r.sweep_id == sweep_id && r.policy == o.policies[c].to_string() && r.book == books[b].name &&
            static_cast<int64_t>(r.kl.size()) == N) {
          done[c][b] = 1;
          ++outcome.cells_resumed;
          continue;
        }
        log << fmt::format("kl-sweep: {} belongs to another sweep; recomputing it\n", p.string());
      } catch (const std::exception& e) {
        log << fmt::format("kl-sweep: {} is unreadable ({}); recomputing it\n", p.string(), e.what());
      }
      fs::remove(p);
    }
  if (outcome.cells_resumed > 0)
    log << fmt::format("kl-sweep: resuming: {} of {} (configuration, book) cells were finished by an earlier run\n",
                       outcome.cells_resumed, outcome.cells_total);

  const int64_t cells_to_run = outcome.cells_total - outcome.cells_resumed;
  ProgressBar::Options popt;
  popt.line_interval_s = o.progress_interval_s;
  popt.interactive = o.progress == "bar" || (o.progress == "auto" && o.log == &std::cerr && stderr_is_terminal());
  const bool show_progress = o.progress != "off";
  ProgressBar bar(show_progress ? log : null_stream, cells_to_run * N, popt);
  const auto note = [&](const std::string& text) {
    if (show_progress)
      bar.message(text);
    else
      log << text << "\n";
  };

  for (std::size_t b = 0; b < B; ++b) {
    bool any = false;
    for (std::size_t c = 0; c < C; ++c) any = any || !done[c][b];
    if (!any) continue;
    const SweepBook& book = books[b];
    const std::span<const int32_t> input(book.tokens.data(), static_cast<std::size_t>(N));
    const std::span<const int32_t> targets(book.tokens.data() + 1, static_cast<std::size_t>(N));
    const std::string where = fmt::format("book {}/{} {}", b + 1, B, book.name);
    bar.set_status(fmt::format("{} | reference {} | forward", where, reference.to_string()));
    const RowMatrixXf ref_hidden = model.final_hidden(input, reference);
    if (ref_hidden.rows() != N || ref_hidden.cols() != hidden)
      throw std::runtime_error(fmt::format("model.final_hidden({}) returned {}x{}, expected {}x{}", reference.to_string(),
                                           ref_hidden.rows(), ref_hidden.cols(), N, hidden));
    for (std::size_t c = 0; c < C; ++c) {
      if (done[c][b]) continue;
      const PrecisionPolicy& policy = o.policies[c];
      const std::string pname = policy.to_string();
      bar.set_status(fmt::format("{} | {} | forward", where, pname));
      const double t0 = now_s();
      const RowMatrixXf h = model.final_hidden(input, policy);
      if (h.rows() != N || h.cols() != hidden)
        throw std::runtime_error(fmt::format("model.final_hidden({}) returned {}x{}, expected {}x{}", pname, h.rows(),
                                             h.cols(), N, hidden));
      const double t1 = now_s();
      bar.set_status(fmt::format("{} | {} | KL", where, pname));
      CellAccumulator acc(N, edges, o.threads);
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
      io::CellRecord rec;
      rec.sweep_id = sweep_id;
      rec.policy = pname;
      rec.book = book.name;
      rec.config_index = static_cast<int64_t>(c);
      rec.book_index = static_cast<int64_t>(b);
      rec.stats = acc.finish();
      rec.kl = acc.kl();
      rec.forward_seconds = t1 - t0;
      rec.kl_seconds = now_s() - t1;
      rec.toolkit_version = version_string();
      io::write_cell((work / cell_file(c, b)).string(), rec);
      ++outcome.cells_run;
      if (rec.stats.nonfinite_positions > 0) {
        int64_t first = -1;
        for (int64_t i = 0; i < N && first < 0; ++i)
          if (!std::isfinite(rec.kl[static_cast<std::size_t>(i)])) first = i;
        note(fmt::format("kl-sweep: {} on {}: {} of {} positions non-finite (first at position {}), {} non-finite "
                         "log-prob values; counted and excluded from the means",
                         pname, book.name, rec.stats.nonfinite_positions, N, first, rec.stats.nonfinite_values));
      }
    }
  }
  bar.finish();

  // Merge the cells into the result file, one configuration at a time.
  io::ResultsMetadata meta;
  meta.toolkit_version = version_string();
  meta.git_commit = git_commit();
  meta.created = utc_now();
  meta.command_line = o.command_line;
  meta.model_description = model.description();
  meta.model_hash = model.content_hash();
  meta.model_dir = o.model_dir;
  meta.text_dir = o.text_dir;
  meta.tokens_dir = o.tokens_dir;
  meta.tokenizer = o.tokenizer;
  meta.tokenization = o.tokenization;
  meta.reference_policy = reference.to_string();
  meta.sweep_json = identity.dump();
  meta.n_positions = N;
  std::vector<io::ResultsBook> rbooks;
  std::vector<std::string> book_names;
  for (const auto& bk : books) {
    io::ResultsBook rb;
    rb.name = bk.name;
    rb.source = bk.source;
    rb.text_fnv1a64 = bk.text_fnv1a64;
    rb.n_tokens = bk.n_tokens;
    rb.tokens.assign(bk.tokens.begin(), bk.tokens.begin() + N + 1);
    rbooks.push_back(std::move(rb));
    book_names.push_back(bk.name);
  }
  io::ResultsWriter writer(o.out_path, meta, rbooks, edges);
  std::set<std::string> versions;
  for (std::size_t c = 0; c < C; ++c) {
    std::vector<io::CellRecord> cells;
    cells.reserve(B);
    for (std::size_t b = 0; b < B; ++b) cells.push_back(io::read_cell((work / cell_file(c, b)).string()));
    std::vector<KlStats> per_book;
    KlStats agg(edges);
    std::vector<float> all;
    all.reserve(B * static_cast<std::size_t>(N));
    io::ConfigAttributes attrs;
    attrs.policy = o.policies[c].to_string();
    for (const auto& cell : cells) {
      per_book.push_back(cell.stats);
      agg.merge(cell.stats);
      all.insert(all.end(), cell.kl.begin(), cell.kl.end());
      attrs.forward_seconds += cell.forward_seconds;
      attrs.kl_seconds += cell.kl_seconds;
      versions.insert(cell.toolkit_version);
    }
    agg.pct = percentiles(all);
    all.clear();
    all.shrink_to_fit();
    nlohmann::json cj = policy_json(o.policies[c]);
    cj["reference"] = reference.to_string();
    cj["n_positions"] = N;
    cj["books"] = book_names;
    attrs.config_json = cj.dump();
    attrs.toolkit_version = cells.empty() ? version_string() : cells.front().toolkit_version;
    writer.add_config(attrs, per_book, agg, [&cells](std::size_t b) { return cells[b].kl; });
    outcome.rows.push_back({attrs.policy, agg});
  }
  meta.toolkit_versions_used.assign(versions.begin(), versions.end());
  writer.set_toolkit_versions_used(meta.toolkit_versions_used);
  writer.commit();
  fs::remove_all(work);
  if (versions.size() > 1)
    log << fmt::format("kl-sweep: note: the cells of {} were computed by {} different builds (see the root attribute "
                       "toolkit_versions_used)\n",
                       o.out_path, versions.size());
  outcome.seconds = now_s() - t_start;
  return outcome;
}

}  // namespace replayssm::eval
