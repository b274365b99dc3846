#include "eval/cell_store.h"

#include <algorithm>
#include <ostream>
#include <set>
#include <stdexcept>

#include <fmt/format.h>

#include "io/atomic_file.h"
#include "io/text_source.h"

namespace replayssm::eval {

namespace fs = std::filesystem;
using ssm::PrecisionPolicy;

// ---- identity ----------------------------------------------------------------------------------

nlohmann::json sweep_identity(const TeacherForcedModel& model, const std::vector<SweepBook>& books,
                              const SweepOptions& o, const std::string& compute) {
  nlohmann::json id;
  id["schema_version"] = kResultsSchemaVersion;
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
  if (compute != "fp32") id["compute"] = compute;  // absent for fp32: identities of earlier files unchanged
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

// ---- the store -----------------------------------------------------------------------------------

CellStore::CellStore(std::string out_path, nlohmann::json identity, std::vector<std::string> policies,
                     std::vector<std::string> books, int64_t n_positions, std::ostream& log)
    : out_(std::move(out_path)),
      identity_(std::move(identity)),
      sweep_id_(io::hex64(io::fnv1a64(identity_.dump()))),
      policies_(std::move(policies)),
      books_(std::move(books)),
      n_(n_positions),
      log_(log),
      done_(policies_.size(), std::vector<uint8_t>(books_.size(), 0)) {
  dir_ = out_.parent_path().empty() ? fs::path(".") : out_.parent_path();
  name_ = out_.filename().string();
  if (name_.empty() || name_ == "." || name_ == "..")
    throw std::invalid_argument(fmt::format("--out {}: not a file name", out_.string()));
  work_ = dir_ / ("." + name_ + ".parts");
}

CellStore::~CellStore() = default;

fs::path CellStore::cell_path(std::size_t config, std::size_t book) const {
  return work_ / fmt::format("c{:04}-b{:05}.h5", config, book);
}

void CellStore::take_lock() { lock_ = std::make_unique<io::FileLock>((dir_ / ("." + name_ + ".lock")).string(), "kl-sweep"); }

std::optional<ResultsSummary> CellStore::existing_result(bool force) const {
  std::error_code ec;
  const fs::file_status st = fs::status(out_, ec);
  if (fs::is_directory(st)) throw std::runtime_error(fmt::format("--out {} is a directory", out_.string()));
  if (!fs::exists(st) || force) return std::nullopt;
  ResultsSummary s;
  try {
    s = read_results_summary(out_.string());
  } catch (const std::exception& e) {
    throw std::runtime_error(fmt::format(
        "{} exists and is not a readable kl-sweep result file ({}); use --force to overwrite it, or --out to write "
        "elsewhere",
        out_.string(), e.what()));
  }
  nlohmann::json old_id;
  try {
    old_id = nlohmann::json::parse(s.meta.sweep_json);
  } catch (const std::exception&) {
    old_id = nlohmann::json();
  }
  if (old_id != identity_)
    throw std::runtime_error(fmt::format(
        "{} already holds the results of a different sweep ({}); use --force to replace it, or --out to write "
        "elsewhere",
        out_.string(), describe_identity_difference(old_id, identity_)));
  const bool configs_complete =
      std::all_of(s.configs.begin(), s.configs.end(), [](const ConfigSummary& c) { return c.complete; });
  if (!s.complete || !configs_complete || s.configs.size() != policies_.size())
    throw std::runtime_error(fmt::format(
        "{} holds this sweep but is not marked complete (a file this toolkit did not write whole); use --force to "
        "recompute it",
        out_.string()));
  return s;
}

std::optional<ResultsSummary> CellStore::open(bool force) {
  // A finished result is reported without the lock: reading needs no write access, and the result
  // is only ever replaced by a rename, so the file read is whole.
  if (auto s = existing_result(force)) {
    std::error_code ec;
    if (fs::exists(work_, ec)) {
      // A run that died between the final rename and its clean-up.
      try {
        take_lock();
        fs::remove_all(work_);
        lock_.reset();
      } catch (const std::exception& e) {
        log_ << fmt::format("kl-sweep: note: could not remove {} left next to the finished result ({})\n",
                            work_.string(), e.what());
      }
    }
    return s;
  }
  fs::create_directories(dir_);
  take_lock();
  io::remove_stale_temps(dir_.string(), name_, log_, "kl-sweep");
  // Again under the lock: another sweep may have finished (or replaced) the result meanwhile.
  if (auto s = existing_result(force)) {
    fs::remove_all(work_);
    lock_.reset();
    return s;
  }

  if (fs::exists(work_)) {
    // Partial results of the same sweep are resumed, with or without --force (force is about
    // replacing a different result; delete the work directory to recompute everything).
    nlohmann::json old_id;
    std::string unreadable;
    try {
      old_id = nlohmann::json::parse(io::read_file((work_ / "sweep.json").string()));
    } catch (const std::exception& e) {
      unreadable = e.what();
    }
    if (!unreadable.empty() || old_id != identity_) {
      if (force) {
        fs::remove_all(work_);
        log_ << fmt::format("kl-sweep: --force: discarded the partial results of a different sweep in {}\n",
                            work_.string());
      } else if (!unreadable.empty()) {
        throw std::runtime_error(fmt::format(
            "{} holds the partial results of an interrupted sweep but its sweep.json is unreadable ({}); use --force "
            "to discard them",
            work_.string(), unreadable));
      } else {
        throw std::runtime_error(fmt::format(
            "an interrupted sweep with different settings left partial results for {} in {} ({}); use --force to "
            "discard them, or --out to write elsewhere",
            out_.string(), work_.string(), describe_identity_difference(old_id, identity_)));
      }
    }
  }
  fs::create_directories(work_);
  if (!fs::exists(work_ / "sweep.json"))
    io::write_file_atomically((work_ / "sweep.json").string(), identity_.dump(2) + "\n");
  io::remove_stale_temps(work_.string(), "", log_, "kl-sweep");

  for (std::size_t c = 0; c < policies_.size(); ++c)
    for (std::size_t b = 0; b < books_.size(); ++b) {
      const fs::path p = cell_path(c, b);
      if (!fs::exists(p)) continue;
      try {
        read_matching(c, b);
        done_[c][b] = 1;
        ++cells_done_;
        continue;
      } catch (const std::exception& e) {
        log_ << fmt::format("kl-sweep: {}; recomputing it\n", e.what());
      }
      fs::remove(p);
    }
  return std::nullopt;
}

void CellStore::attach(std::vector<std::vector<uint8_t>> done) {
  if (done.size() != policies_.size() ||
      std::any_of(done.begin(), done.end(), [&](const auto& row) { return row.size() != books_.size(); }))
    throw std::invalid_argument(fmt::format("CellStore::attach: a map of finished cells that is not {} x {}",
                                            policies_.size(), books_.size()));
  nlohmann::json id;
  try {
    id = nlohmann::json::parse(io::read_file((work_ / "sweep.json").string()));
  } catch (const std::exception& e) {
    throw std::runtime_error(fmt::format(
        "{} is not readable here ({}), though rank 0 created it: every rank must see the output's folder on a "
        "shared filesystem (--out on a cluster filesystem, not a node-local disk)",
        (work_ / "sweep.json").string(), e.what()));
  }
  if (id != identity_)
    throw std::runtime_error(fmt::format("{} holds another sweep than this rank's ({})", (work_ / "sweep.json").string(),
                                         describe_identity_difference(id, identity_)));
  done_ = std::move(done);
  cells_done_ = 0;
  for (const auto& row : done_) cells_done_ += std::count_if(row.begin(), row.end(), [](uint8_t d) { return d != 0; });
}

CellRecord CellStore::read_matching(std::size_t c, std::size_t b) const {
  const std::string p = cell_path(c, b).string();
  CellRecord r = read_cell(p);
  if (r.sweep_id != sweep_id_ || r.policy != policies_[c] || r.book != books_[b])
    throw std::runtime_error(fmt::format("{} belongs to another sweep ({} on book {})", p, r.policy, r.book));
  if (static_cast<int64_t>(r.kl.size()) != n_ || r.stats.edges != length_bucket_edges(n_))
    throw std::runtime_error(fmt::format("{} holds {} positions, expected {}", p, r.kl.size(), n_));
  return r;
}

bool CellStore::done(std::size_t config, std::size_t book) const { return done_.at(config).at(book) != 0; }
int64_t CellStore::cells_done() const { return cells_done_; }

void CellStore::write(std::size_t config, std::size_t book, CellRecord cell) {
  cell.sweep_id = sweep_id_;
  cell.policy = policies_.at(config);
  cell.book = books_.at(book);
  cell.config_index = static_cast<int64_t>(config);
  cell.book_index = static_cast<int64_t>(book);
  write_cell(cell_path(config, book).string(), cell);
  if (!done_[config][book]) ++cells_done_;
  done_[config][book] = 1;
}

namespace {

// The configurations that differ only by their SR seed (",seed=N"), as lists of indices into
// `policies` with at least two members; a name that is not a policy (the compute noise floor) is
// in no group.
std::vector<std::vector<std::size_t>> seed_groups(const std::vector<std::string>& policies) {
  std::vector<std::string> base(policies.size());
  for (std::size_t c = 0; c < policies.size(); ++c) {
    try {
      PrecisionPolicy p = PrecisionPolicy::parse(policies[c]);
      p.seed = 0;
      base[c] = p.to_string();
    } catch (const std::invalid_argument&) {
      base[c].clear();
    }
  }
  std::vector<std::vector<std::size_t>> groups;
  std::vector<uint8_t> taken(policies.size(), 0);
  for (std::size_t c = 0; c < policies.size(); ++c) {
    if (taken[c] || base[c].empty()) continue;
    std::vector<std::size_t> g;
    for (std::size_t d = c; d < policies.size(); ++d)
      if (!taken[d] && base[d] == base[c]) g.push_back(d), taken[d] = 1;
    if (g.size() >= 2) groups.push_back(std::move(g));
  }
  return groups;
}

// The spread over books of the per-book means, overall and per bucket (books' strata kept apart).
void set_book_spread(KlStats& agg, const std::vector<KlStats>& per_book) {
  std::vector<double> means;
  for (const KlStats& s : per_book) means.push_back(s.mean_kl());
  agg.mean_kl_book_se = spread_standard_error(means);
  for (std::size_t k = 0; k < agg.bucket_mean_book_se.size(); ++k) {
    means.clear();
    for (const KlStats& s : per_book) means.push_back(s.bucket_mean()[k]);
    agg.bucket_mean_book_se[k] = spread_standard_error(means);
  }
}

}  // namespace

std::vector<SummaryRow> CellStore::merge(ResultsMetadata meta, const std::vector<ResultsBook>& books,
                                         const std::vector<std::string>& config_jsons) {
  const std::size_t B = books_.size(), C = policies_.size();
  const std::vector<int64_t> edges = length_bucket_edges(n_);
  const std::size_t K = edges.size() - 1;
  // Pass 1, the sums only: each configuration's pooled means, for the spread over SR seeds.
  std::vector<KlStats> pooled(C, KlStats(edges));
  for (std::size_t c = 0; c < C; ++c)
    for (std::size_t b = 0; b < B; ++b) pooled[c].merge(read_matching(c, b).stats);
  std::vector<KlStats> seed_spread(C, KlStats(edges));
  for (const std::vector<std::size_t>& group : seed_groups(policies_)) {
    std::vector<double> means;
    for (std::size_t c : group) means.push_back(pooled[c].mean_kl());
    const double overall = spread_standard_error(means);
    std::vector<double> per_bucket(K);
    for (std::size_t k = 0; k < K; ++k) {
      means.clear();
      for (std::size_t c : group) means.push_back(pooled[c].bucket_mean()[k]);
      per_bucket[k] = spread_standard_error(means);
    }
    for (std::size_t c : group) {
      seed_spread[c].mean_kl_seed_se = overall;
      seed_spread[c].bucket_mean_seed_se = per_bucket;
      for (std::size_t d : group) seed_spread[c].seed_group.push_back(policies_[d]);
    }
  }
  pooled.clear();

  ResultsWriter writer(out_.string(), meta, books, edges);
  std::set<std::string> versions, isas, devices;
  std::vector<SummaryRow> rows;
  for (std::size_t c = 0; c < C; ++c) {
    std::vector<CellRecord> cells;
    cells.reserve(B);
    for (std::size_t b = 0; b < B; ++b) cells.push_back(read_matching(c, b));
    std::vector<KlStats> per_book;
    KlStats agg(edges);
    std::vector<float> all;
    all.reserve(B * static_cast<std::size_t>(n_));
    std::vector<const BlockSums*> strata;
    ConfigAttributes attrs;
    attrs.policy = policies_[c];
    attrs.config_json = config_jsons.at(c);
    for (const auto& cell : cells) {
      per_book.push_back(cell.stats);
      agg.merge(cell.stats);
      all.insert(all.end(), cell.kl.begin(), cell.kl.end());
      strata.push_back(&cell.stats.blocks);
      attrs.forward_seconds += cell.forward_seconds;
      attrs.kl_seconds += cell.kl_seconds;
      versions.insert(cell.toolkit_version);
      isas.insert(cell.host_isa.empty() ? "unknown" : cell.host_isa);
      devices.insert(cell.device.empty() ? "cpu" : cell.device);
    }
    agg.pct = percentiles(all);
    // Bucket k over all books: positions [edges[k], edges[k + 1]) of every book's row.
    for (std::size_t k = 0; k < K; ++k) {
      std::vector<float> bucket;
      for (const auto& cell : cells)
        bucket.insert(bucket.end(), cell.kl.begin() + edges[k], cell.kl.begin() + edges[k + 1]);
      agg.bucket_pct[k] = percentiles(bucket);
    }
    all = {};
    agg.se = block_bootstrap(strata, edges);
    set_book_spread(agg, per_book);
    agg.mean_kl_seed_se = seed_spread[c].mean_kl_seed_se;
    agg.bucket_mean_seed_se = seed_spread[c].bucket_mean_seed_se;
    agg.seed_group = seed_spread[c].seed_group;
    attrs.toolkit_version = cells.empty() ? meta.toolkit_version : cells.front().toolkit_version;
    writer.add_config(attrs, per_book, agg, [&cells](std::size_t b) { return cells[b].kl; });
    rows.push_back({attrs.policy, agg});
  }
  writer.set_toolkit_versions_used(std::vector<std::string>(versions.begin(), versions.end()));
  std::string isa;
  for (const auto& x : isas) isa += (isa.empty() ? "" : "; ") + x;
  writer.set_host_isa(isa);
  std::string device;
  for (const auto& x : devices) device += (device.empty() ? "" : "; ") + x;
  writer.set_device(device);
  writer.commit();
  fs::remove_all(work_);
  lock_.reset();
  if (versions.size() > 1)
    log_ << fmt::format("kl-sweep: note: the cells of {} were computed by {} different builds (see the root attribute "
                        "toolkit_versions_used)\n",
                        out_.string(), versions.size());
  if (isas.size() > 1)
    log_ << fmt::format("kl-sweep: note: the cells of {} were computed by builds for different host ISAs ({}; see the "
                        "root attribute host_isa)\n",
                        out_.string(), isa);
  if (devices.size() > 1)
    log_ << fmt::format("kl-sweep: note: the cells of {} were computed on different devices ({}; see the root "
                        "attribute device): their values differ by floating-point rounding\n",
                        out_.string(), device);
  return rows;
}

}  // namespace replayssm::eval
