// replayssm kl-sweep: the teacher-forced KL of every configuration against the FP32 reference on
// PG-19 books (REPLAYSSM.md section 10), written to an HDF5 result file (io/hdf5_results.h) that
// scripts/plot_kl.py turns into the paper's figures. Options come from flags or a TOML file
// (--config experiments/fig5.toml); an option given on the command line replaces the file's value.
//
// Every option is taken as text from the command line (CLI11 only collects the words) or as a
// TOML value from the file (read with toml++), and converted by one function per kind of value,
// so both sources get the same checks. A message starts with where the value came from:
// "--length: ..." or "exp.toml:9:10: key 'length': ...".
#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <toml++/toml.h>

#include "cli/commands.h"
#include "cli/engine_choice.h"
#include "eval/kl_sweep.h"
#include "eval/policy_set.h"
#include "eval/statistics_table.h"
#include "io/text_source.h"
#include "model/teacher_forced_model.h"

#if REPLAYSSM_WITH_MPI
#include "dist/mpi_team.h"
#endif
#if REPLAYSSM_WITH_CUDA
#include "eval/cuda_sweep_engine.h"
#endif

namespace replayssm::cli {
namespace {

namespace fs = std::filesystem;

// ---- the options ------------------------------------------------------------------------------

struct Setting {
  const char* name;       // the long option without "--" and the TOML key; "model-dir" is the positional MODEL_DIR
  const char* type_name;  // the value's form for --help; nullptr: a flag
  const char* help;
};

constexpr int kMaxThreads = 1024;
constexpr int kMaxChunk = 1 << 20;

const std::vector<Setting>& settings() {
  static const std::vector<Setting> all = {
      {"model-dir", "DIR", "Hugging Face checkpoint directory (config.json + safetensors); required"},
      {"text-dir", "DIR", "folder of PG-19 .txt books (Gutenberg boilerplate is stripped); required"},
      {"tokens-dir", "DIR",
       "token ids written by scripts/tokenize_text.py with the model's tokenizer (default: byte-level ids)"},
      {"byte-offset", "N", "byte-level ids: id = byte value + offset, 0 to 2147483392 (default 0)"},
      {"books", "N", "number of books, the first in name order (default 0: all)"},
      {"length", "N", "N: positions per book, 1 to 2^40 (each book needs N + 1 tokens); required"},
      {"short-books", "error|skip", "a book shorter than N + 1 tokens: error | skip (default error)"},
      {"policies", "P1,P2",
       "configurations, comma-separated, may be repeated (default: the paper's set); shared/split policies "
       "without '@L' are expanded over --windows"},
      {"windows", "L1,L2",
       "windows L (1 to 2^20) for policies given without '@L', comma-separated, may be repeated (default 16)"},
      {"seeds", "S1,S2",
       "stochastic-rounding seeds for SR policies without ',seed=', comma-separated, may be repeated (default 0)"},
      {"out", "FILE", "result file (.h5); required"},
      {"force", nullptr, "replace an existing result file or discard a different sweep's partial results"},
      {"reference", "POLICY", "reference policy (default conv:fp32)"},
      {"chunk", "N", "positions per log-probability chunk, 1 to 2^20; memory chunk x vocab floats x 2 (default 1024)"},
      {"threads", "N", "worker threads of the CPU forward and the KL, 0 to 1024 (default 0: all cores; under mpirun: the node's cores / its processes)"},
      {"device", "DEVICE", kDeviceHelp},
      {"compute", "PRECISION", kComputeHelp},
      {"progress", "MODE", "auto | bar | lines | off (default auto)"},
      {"dry-run", nullptr, "load the books and expand the configurations, then stop (no model)"},
  };
  return all;
}

const Setting* find_setting(std::string_view name) {
  for (const Setting& s : settings())
    if (name == s.name) return &s;
  return nullptr;
}

std::string setting_names() {
  std::string names;
  for (const Setting& s : settings()) names += fmt::format("{}{}", names.empty() ? "" : ", ", s.name);
  return names;
}

struct KlSweepOptions {
  std::string model_dir, text_dir, tokens_dir, out, reference = "conv:fp32", progress = "auto";
  io::ShortBooks short_books = io::ShortBooks::error;
  int books = 0, chunk = 1024, threads = 0;
  int64_t length = 0;
  int32_t byte_offset = 0;
  bool byte_offset_given = false;
  std::vector<ssm::PolicySpec> policies;  // empty: the default set
  std::vector<int> windows;
  std::vector<uint64_t> seeds;
  bool force = false, dry_run = false;
  EngineChoice engine;
};

// ---- one given value and its conversions --------------------------------------------------------

// A setting as given: on the command line (the words after the option, one per occurrence) or in
// the --config file (a TOML value).
struct Given {
  std::string where;                 // "--length" or "FILE:LINE:COL: key 'length'"
  std::vector<std::string> words;    // command line
  const toml::node* node = nullptr;  // config file
  bool from_file() const { return node != nullptr; }
};

[[noreturn]] void refuse(const std::string& message) { throw std::invalid_argument(message); }

std::string describe(const toml::node& n) {
  switch (n.type()) {
    case toml::node_type::string: return fmt::format("the string \"{}\"", *n.value<std::string>());
    case toml::node_type::integer: return fmt::format("the integer {}", *n.value<int64_t>());
    case toml::node_type::floating_point: return fmt::format("the float {:#}", *n.value<double>());
    case toml::node_type::boolean: return fmt::format("the boolean {}", *n.value<bool>());
    case toml::node_type::array: return "an array";
    case toml::node_type::table: return "a table";
    default: return "a date or time";
  }
}

// The one word of a single-valued option (CLI11 collects every occurrence).
const std::string& single_word(const Given& g) {
  if (g.words.size() != 1) {
    std::string all;
    for (const auto& w : g.words) all += fmt::format("{}'{}'", all.empty() ? "" : ", ", w);
    refuse(fmt::format("{}: given {} times ({}); give it once", g.where, g.words.size(), all));
  }
  return g.words.front();
}

// A non-empty string without NUL (paths, choices, policies).
std::string string_value(const Given& g, std::string_view expected) {
  std::string text;
  if (g.from_file()) {
    if (!g.node->is_string()) refuse(fmt::format("{}: expected {}, got {}", g.where, expected, describe(*g.node)));
    text = *g.node->value<std::string>();
  } else {
    text = single_word(g);
  }
  if (text.empty()) refuse(fmt::format("{}: empty; expected {}", g.where, expected));
  if (text.find('\0') != std::string::npos) refuse(fmt::format("{}: contains a NUL character", g.where));
  return text;
}

std::string choice_value(const Given& g, const std::vector<std::string>& choices) {
  std::string expected;
  for (const auto& c : choices) expected += fmt::format("{}'{}'", expected.empty() ? "one of " : ", ", c);
  const std::string text = string_value(g, expected);
  for (const auto& c : choices)
    if (text == c) return text;
  refuse(fmt::format("{}: '{}' is not {}", g.where, text, expected));
}

struct IntRange {
  int64_t lo, hi;
  std::string expected;  // "a positive integer up to 2^40"
};

// Parses all of `text` as a decimal integer: digits with an optional leading '-', nothing else.
std::optional<int64_t> parse_int64(std::string_view text) {
  int64_t v = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || end != text.data() + text.size() || text.empty()) return std::nullopt;
  return v;
}

int64_t int_of_word(const std::string& where, const std::string& word, const IntRange& r) {
  const std::optional<int64_t> v = parse_int64(word);
  if (!v || *v < r.lo || *v > r.hi) refuse(fmt::format("{}: '{}' is not {}", where, word, r.expected));
  return *v;
}

int64_t int_of_node(const std::string& where, const toml::node& n, const IntRange& r) {
  if (!n.is_integer()) refuse(fmt::format("{}: expected {}, got {}", where, r.expected, describe(n)));
  const int64_t v = *n.value<int64_t>();
  if (v < r.lo || v > r.hi) refuse(fmt::format("{}: expected {}, got {}", where, r.expected, v));
  return v;
}

int64_t integer_value(const Given& g, const IntRange& r) {
  return g.from_file() ? int_of_node(g.where, *g.node, r) : int_of_word(g.where, single_word(g), r);
}

bool flag_value(const Given& g) {
  if (!g.from_file()) return true;
  if (!g.node->is_boolean())
    refuse(fmt::format("{}: expected true or false, got {}", g.where, describe(*g.node)));
  return *g.node->value<bool>();
}

// The elements of a list setting, each with where it came from: on the command line every
// occurrence is split at commas ("--windows 4,8 --windows 16"); in the file the value is an array.
struct Element {
  std::string where, word;           // command line: the piece between commas
  const toml::node* node = nullptr;  // config file: the array element
};

std::string trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return std::string(s);
}

std::vector<Element> list_elements(const Given& g, std::string_view expected) {
  std::vector<Element> out;
  if (g.from_file()) {
    const toml::array* a = g.node->as_array();
    if (a == nullptr) refuse(fmt::format("{}: expected an array of {}, got {}", g.where, expected, describe(*g.node)));
    if (a->empty())
      refuse(fmt::format("{}: an empty array; expected {} (leave the key out for the default)", g.where, expected));
    for (std::size_t i = 0; i < a->size(); ++i) {
      const toml::node& n = *a->get(i);
      out.push_back({fmt::format("{}, element {}", g.where, i + 1), "", &n});
    }
    return out;
  }
  for (const std::string& word : g.words) {
    if (trim(word).empty())
      refuse(fmt::format("{}: '{}' is an empty list; expected {}, comma-separated", g.where, word, expected));
    std::size_t start = 0;
    while (true) {
      const std::size_t comma = std::min(word.find(',', start), word.size());
      const std::string piece = trim(std::string_view(word).substr(start, comma - start));
      if (piece.empty())
        refuse(fmt::format("{}: '{}' has an empty entry (two commas in a row, or a comma at an end); expected {}, "
                           "comma-separated",
                           g.where, word, expected));
      out.push_back({g.where, piece, nullptr});
      if (comma == word.size()) break;
      start = comma + 1;
    }
  }
  return out;
}

std::vector<int> window_list(const Given& g) {
  const IntRange r{1, ssm::kMaxWindow, fmt::format("a window: an integer in [1, {}]", ssm::kMaxWindow)};
  std::vector<int> out;
  for (const Element& e : list_elements(g, "windows, integers in [1, 1048576]")) {
    const int L = static_cast<int>(e.node ? int_of_node(e.where, *e.node, r) : int_of_word(e.where, e.word, r));
    if (std::find(out.begin(), out.end(), L) != out.end())
      refuse(fmt::format("{}: window {} is listed twice", e.where, L));
    out.push_back(L);
  }
  return out;
}

std::vector<uint64_t> seed_list(const Given& g) {
  std::vector<uint64_t> out;
  for (const Element& e : list_elements(g, "seeds, non-negative integers")) {
    uint64_t seed = 0;
    if (e.node) {
      // TOML integers are signed 64-bit: seeds from 2^63 on need the command line.
      seed = static_cast<uint64_t>(
          int_of_node(e.where, *e.node, {0, INT64_MAX, "a seed: a non-negative integer (in TOML below 2^63)"}));
    } else {
      const auto [end, ec] = std::from_chars(e.word.data(), e.word.data() + e.word.size(), seed);
      if (ec != std::errc() || end != e.word.data() + e.word.size())
        refuse(fmt::format("{}: '{}' is not a non-negative integer below 2^64", e.where, e.word));
    }
    if (std::find(out.begin(), out.end(), seed) != out.end())
      refuse(fmt::format("{}: seed {} is listed twice", e.where, seed));
    out.push_back(seed);
  }
  return out;
}

std::vector<ssm::PolicySpec> policy_list(const Given& g) {
  std::vector<ssm::PolicySpec> out;
  // Each word (command line) or array element (file) is a whole policy list: commas belong to it.
  std::vector<std::pair<std::string, std::string>> lists;  // (where, text)
  if (g.from_file()) {
    for (const Element& e : list_elements(g, "policy lists (strings)")) {
      if (!e.node->is_string())
        refuse(fmt::format("{}: expected a policy string such as \"shared:nvfp4+sr\", got {}", e.where,
                           describe(*e.node)));
      lists.emplace_back(e.where, *e.node->value<std::string>());
    }
  } else {
    for (const std::string& w : g.words) lists.emplace_back(g.where, w);
  }
  for (const auto& [where, text] : lists) {
    try {
      for (auto& spec : eval::parse_policy_list(text)) out.push_back(std::move(spec));
    } catch (const std::invalid_argument& e) {
      refuse(fmt::format("{}: {}", where, e.what()));
    }
  }
  return out;
}

// ---- the --config file --------------------------------------------------------------------------

// The settings of a --config file: top-level keys, or keys of a [kl-sweep] table, once each.
// Keeps the parsed document alive for the nodes it hands out.
class ConfigFile {
 public:
  explicit ConfigFile(const std::string& path) : path_(path) {
    std::error_code ec;
    const fs::file_status st = fs::status(path, ec);
    if (!fs::exists(st)) refuse(fmt::format("--config {}: no such file", path));
    if (!fs::is_regular_file(st)) refuse(fmt::format("--config {}: not a regular file", path));
    try {
      root_ = toml::parse_file(path);
    } catch (const toml::parse_error& e) {
      const toml::source_position at = e.source().begin;
      if (at.line == 0) refuse(fmt::format("--config {}: {}", path, e.description()));
      refuse(fmt::format("{}:{}:{}: invalid TOML: {}", path, at.line, at.column, e.description()));
    }
    for (auto&& [key, node] : root_) {
      if (key.str() == "kl-sweep" && node.is_table()) {
        for (auto&& [k, v] : *node.as_table()) add(k, v, "kl-sweep.");
      } else {
        add(key, node, "");
      }
    }
  }

  std::optional<Given> get(const std::string& name) const {
    const auto it = values_.find(name);
    if (it == values_.end()) return std::nullopt;
    const toml::source_position at = it->second->source().begin;
    return Given{fmt::format("{}:{}:{}: key '{}'", path_, at.line, at.column, name), {}, it->second};
  }

 private:
  std::string place(const toml::key& key) const {
    return fmt::format("{}:{}:{}", path_, key.source().begin.line, key.source().begin.column);
  }

  void add(const toml::key& key, const toml::node& node, const std::string& table) {
    const std::string name(key.str());
    if (const toml::table* t = node.as_table(); t != nullptr && !t->is_inline())
      refuse(fmt::format("{}: table [{}{}] is not part of the format: settings go at the top level or in a "
                         "[kl-sweep] table",
                         place(key), table, name));
    if (const toml::array* a = node.as_array(); a != nullptr && a->is_array_of_tables() && !a->empty() &&
                                                a->get(0)->as_table() && !a->get(0)->as_table()->is_inline())
      refuse(fmt::format("{}: array of tables [[{}{}]] is not part of the format", place(key), table, name));
    const Setting* s = find_setting(name);
    if (s == nullptr) {
      std::string hint;
      std::string dashed = name;
      std::replace(dashed.begin(), dashed.end(), '_', '-');
      if (dashed != name && find_setting(dashed) != nullptr) hint = fmt::format(" (did you mean '{}'?)", dashed);
      refuse(fmt::format("{}: unknown key '{}{}'{}; the keys are the kl-sweep options without '--': {}", place(key),
                         table, name, hint, setting_names()));
    }
    const auto [it, inserted] = values_.emplace(name, &node);
    if (!inserted)
      refuse(fmt::format("{}: key '{}' is also set at line {}: give each setting once, at the top level or in "
                         "[kl-sweep]",
                         place(key), name, it->second->source().begin.line));
  }

  std::string path_;
  toml::table root_;
  std::map<std::string, const toml::node*> values_;
};

// ---- from both sources to the options -------------------------------------------------------------

class Sources {
 public:
  Sources(const CLI::App& cmd, const ConfigFile* file) : cmd_(cmd), file_(file) {}

  // The command line wins; otherwise the file; otherwise nothing (the default).
  std::optional<Given> get(const Setting& s) const {
    const CLI::Option* opt = cmd_.get_option(cli_name(s));
    if (opt->count() > 0) return Given{cli_name(s), opt->results(), nullptr};
    if (file_ != nullptr) return file_->get(s.name);
    return std::nullopt;
  }
  static std::string cli_name(const Setting& s) {
    return std::string_view(s.name) == "model-dir" ? "MODEL_DIR" : fmt::format("--{}", s.name);
  }

 private:
  const CLI::App& cmd_;
  const ConfigFile* file_;
};

KlSweepOptions resolve_options(const Sources& src) {
  KlSweepOptions o;
  const auto get = [&](const char* name) { return src.get(*find_setting(name)); };
  const auto required = [&](const char* name) {
    std::optional<Given> g = get(name);
    if (!g)
      refuse(fmt::format("kl-sweep: {} is required (on the command line or as '{}' in the --config file)",
                         Sources::cli_name(*find_setting(name)), name));
    return *g;
  };
  o.model_dir = string_value(required("model-dir"), "a checkpoint directory");
  o.text_dir = string_value(required("text-dir"), "a folder of .txt books");
  o.out = string_value(required("out"), "a result file name");
  o.length = integer_value(required("length"),
                           {1, io::kMaxLength, fmt::format("a positive integer up to 2^40 = {}", io::kMaxLength)});
  if (auto g = get("tokens-dir")) o.tokens_dir = string_value(*g, "a folder written by scripts/tokenize_text.py");
  if (auto g = get("byte-offset")) {
    o.byte_offset = static_cast<int32_t>(integer_value(
        *g, {0, io::kMaxByteOffset, fmt::format("an integer in [0, {}] (byte + offset must be an int32 id)",
                                                io::kMaxByteOffset)}));
    o.byte_offset_given = true;
  }
  if (auto g = get("books"))
    o.books = static_cast<int>(integer_value(*g, {0, INT32_MAX, "a non-negative integer below 2^31 (0: all)"}));
  if (auto g = get("short-books"))
    o.short_books = io::parse_short_books(choice_value(*g, {"error", "skip"}));
  if (auto g = get("policies")) o.policies = policy_list(*g);
  if (auto g = get("windows")) o.windows = window_list(*g);
  if (auto g = get("seeds")) o.seeds = seed_list(*g);
  if (auto g = get("force")) o.force = flag_value(*g);
  if (auto g = get("dry-run")) o.dry_run = flag_value(*g);
  if (auto g = get("reference")) {
    o.reference = string_value(*g, "a precision policy such as conv:fp32");
    try {
      ssm::PrecisionPolicy::parse(o.reference);
    } catch (const std::invalid_argument& e) {
      refuse(fmt::format("{}: {}", g->where, e.what()));
    }
  }
  if (auto g = get("chunk"))
    o.chunk = static_cast<int>(integer_value(*g, {1, kMaxChunk, fmt::format("an integer in [1, {}]", kMaxChunk)}));
  if (auto g = get("threads"))
    o.threads = static_cast<int>(
        integer_value(*g, {0, kMaxThreads, fmt::format("an integer in [0, {}] (0: all cores)", kMaxThreads)}));
  if (auto g = get("progress")) o.progress = choice_value(*g, {"auto", "bar", "lines", "off"});
  if (auto g = get("device")) o.engine.device = choice_value(*g, {"cpu", "cuda", "auto"});
  if (auto g = get("compute")) o.engine.compute = choice_value(*g, {"fp32", "bf16x3", "bf16"});
  if (o.byte_offset_given && !o.tokens_dir.empty())
    refuse("--byte-offset applies to byte-level ids only, but --tokens-dir is given (its ids come from the "
           "tokenizer): drop one of them");
  return o;
}

std::string command_line() {
  std::ifstream in("/proc/self/cmdline", std::ios::binary);
  std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::string out;
  std::string arg;
  for (char c : all) {
    if (c == '\0') {
      const bool quote = arg.empty() || arg.find_first_of(" \t\"'$\\") != std::string::npos;
      out += (out.empty() ? "" : " ") + (quote ? "'" + arg + "'" : arg);
      arg.clear();
    } else {
      arg += c;
    }
  }
  return out;
}

// Windows and seeds given but taken by no policy (each has its own '@L' / ',seed=', or none needs
// one) are said so: the run is still what the policies ask for.
void note_unused_lists(const std::vector<ssm::PolicySpec>& specs, const KlSweepOptions& o, std::ostream& info) {
  bool windows_used = false, seeds_used = false;
  for (const auto& s : specs) {
    windows_used |= !s.window_given && s.policy.scheme != ssm::DecodeScheme::conventional;
    seeds_used |= !s.seed_given && eval::uses_stochastic_rounding(s.policy);
  }
  if (!o.windows.empty() && !windows_used)
    info << fmt::format("kl-sweep: note: windows {} are not used: no shared/split policy is written without "
                        "'@L'\n",
                        fmt::join(o.windows, ","));
  if (!o.seeds.empty() && !seeds_used)
    info << fmt::format("kl-sweep: note: seeds {} are not used: no policy with stochastic rounding is written "
                        "without ',seed='\n",
                        fmt::join(o.seeds, ","));
}

// The processes sharing this sweep (docs/MPI_SWEEP.md): none (team null) for a plain run.
struct Processes {
  eval::SweepTeam* team = nullptr;
  int local_rank = 0, local_size = 1;  // on this node
  std::string mpi;                     // the MPI library
};

// How many processes an MPI launcher started with this one, from the variables it sets before
// MPI is initialised (so a plain run never touches MPI): Open MPI's mpirun, MPICH/Slurm PMI-2,
// Slurm's srun with PMIx. 1: a plain run. (sbatch alone sets SLURM_NTASKS but no PMI variables:
// a command run directly in a batch script is one process.)
int launched_process_count() {
  const auto number = [](const char* name) -> int {
    const char* v = std::getenv(name);
    if (v == nullptr) return 0;
    const std::optional<int64_t> n = parse_int64(v);
    return n && *n > 0 && *n <= INT32_MAX ? static_cast<int>(*n) : 0;
  };
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE"})
    if (const int n = number(name)) return n;
  if (std::getenv("PMIX_RANK") != nullptr)
    if (const int n = number("SLURM_STEP_NUM_TASKS")) return n;
  return 1;
}

void run_sweep(const KlSweepOptions& o, const Processes& procs) {
  // Ranks other than 0 print only what concerns them, prefixed with their rank (their notes and
  // errors); the run's description and the summary come from rank 0.
  std::ostream null_stream(nullptr);
  const bool lead = procs.team == nullptr || procs.team->rank() == 0;
  std::ostream& info = lead ? std::cerr : null_stream;
  const std::vector<ssm::PolicySpec> specs = o.policies.empty() ? eval::default_policy_specs() : o.policies;
  const std::vector<ssm::PrecisionPolicy> policies = eval::expand_policies(specs, o.windows, o.seeds);
  note_unused_lists(specs, o, info);

  io::TextSourceOptions to;
  to.text_dir = o.text_dir;
  to.tokens_dir = o.tokens_dir;
  to.byte_offset = o.byte_offset;
  to.length = o.length;
  to.max_books = o.books;
  to.short_books = o.short_books;
  io::LoadedBooks loaded = io::load_books(to);

  info << fmt::format("kl-sweep: {} book{} from {} ({}), N = {} positions each\n", loaded.books.size(),
                      loaded.books.size() == 1 ? "" : "s", o.text_dir, loaded.tokenization, o.length);
  for (const auto& b : loaded.books)
    info << fmt::format("  {:<12} {:>9} tokens{}\n", b.name, b.tokens.size(),
                        b.header_found ? "" : "  (no Gutenberg header: taken whole)");
  for (const auto& s : loaded.skipped) info << "  skipped " << s << "\n";
  info << fmt::format("kl-sweep: reference {}; {} configuration{}:\n", o.reference, policies.size(),
                      policies.size() == 1 ? "" : "s");
  for (const auto& p : policies) info << "  " << p.to_string() << "\n";
  // Threads per rank: the cores of the node shared by its ranks (--threads 0).
  const int threads =
      o.threads > 0 || procs.team == nullptr
          ? o.threads
          : std::max(1, static_cast<int>(std::thread::hardware_concurrency()) / std::max(1, procs.local_size));
  if (procs.team)
    info << fmt::format("kl-sweep: {} processes ({}), {} on this node; worker threads per process: {}{}\n",
                        procs.team->size(), procs.mpi, procs.local_size, threads,
                        o.threads > 0 ? " (--threads)" : " (the node's cores / its processes)");
  if (o.dry_run) {
    info << fmt::format("kl-sweep: --dry-run: stopping before loading the model {} (results would go to {})\n",
                        o.model_dir, o.out);
    return;
  }

  const std::unique_ptr<model::TeacherForcedModel> lm = model::load_teacher_forced_model(o.model_dir, threads);
  info << fmt::format("kl-sweep: model {} ({}; vocabulary {}, hidden {})\n", o.model_dir, lm->description(),
                      lm->vocab_size(), lm->hidden_size());

  std::vector<eval::SweepBook> books;
  for (auto& b : loaded.books) {
    eval::SweepBook sb;
    sb.name = b.name;
    sb.source = b.source;
    sb.text_fnv1a64 = io::hex64(b.text_hash);
    sb.n_tokens = static_cast<int64_t>(b.tokens.size());
    sb.tokens = std::move(b.tokens);
    books.push_back(std::move(sb));
  }
  eval::SweepOptions so;
  so.n_positions = o.length;
  so.policies = policies;
  so.reference = o.reference;
  so.chunk_rows = o.chunk;
  so.threads = threads;
  so.out_path = o.out;
  so.force = o.force;
  so.command_line = command_line();
  so.model_dir = o.model_dir;
  so.text_dir = o.text_dir;
  so.tokens_dir = o.tokens_dir;
  so.tokenizer = loaded.tokenizer;
  so.tokenization = loaded.tokenization;
  so.log = &std::cerr;
  so.progress = o.progress;
  so.team = procs.team;
#if REPLAYSSM_WITH_CUDA
  // One GPU per rank: local rank % the node's GPUs, before the engine creates its context.
  if (procs.team && o.engine.device != "cpu" && cuda::cuda_unavailable_reason().empty())
    std::cerr << fmt::format("[rank {}] kl-sweep: {}\n", procs.team->rank(),
                             cuda::bind_device_for_local_rank(procs.local_rank));
#endif
  std::vector<ssm::PrecisionPolicy> engine_policies = policies;  // what the engine must run, the reference too
  engine_policies.push_back(ssm::PrecisionPolicy::parse(o.reference));
  const std::unique_ptr<eval::SweepEngine> engine =
      make_engine(*lm, o.engine, threads, o.chunk, info, "kl-sweep", engine_policies);
  const eval::SweepOutcome r = eval::run_kl_sweep(*engine, books, so);
  if (!lead) return;
  std::cout << eval::format_summary_table(r.rows) << "\n" << eval::format_statistics_table(r.rows);
  std::cout << fmt::format("results: {} ({} cells: {} computed now, {} from an earlier run; {})\n", r.path,
                           r.cells_total, r.cells_run, r.cells_resumed, eval::human_duration(r.seconds));
}

void run_kl_sweep_command(const KlSweepOptions& o) {
  const int launched = launched_process_count();
#if REPLAYSSM_WITH_MPI
  if (launched > 1) {
    const std::unique_ptr<dist::MpiTeam> team = dist::MpiTeam::join();
    const Processes procs{team->size() > 1 ? team.get() : nullptr, team->local_rank(), team->local_size(),
                          team->library_version()};
    try {
      run_sweep(o, procs);
    } catch (const std::exception& e) {
      // A rank that fails ends the job: the others would wait for it forever. Finished cells are
      // on disk; the same command resumes.
      std::cerr << fmt::format("replayssm: error (rank {} of {}): {}\n", team->rank(), team->size(), e.what());
      team->abort(2);
    }
    return;
  }
#else
  if (launched > 1)
    refuse(fmt::format("kl-sweep: started as one of {} processes (mpirun, srun), but this build has no MPI support: "
                       "install MPI and configure with -DREPLAYSSM_MPI=ON (docs/MPI_SWEEP.md), or run one process",
                       launched));
#endif
  run_sweep(o, Processes{});
}

}  // namespace

void register_kl_sweep(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand(
      "kl-sweep",
      "Teacher-forced KL of low-precision state configurations against FP32 conventional decode on PG-19 books\n"
      "(REPLAYSSM.md section 10). Writes an HDF5 result file (docs/KL_SWEEP.md); an interrupted sweep resumes\n"
      "where it stopped when run again with the same settings.");
  cmd->add_option("--config",
                  "TOML file with any of the options below, keys without '--' (e.g. experiments/fig5.toml); an "
                  "option on the command line replaces the file's value")
      ->type_name("FILE")
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);  // the callback refuses two files
  // Options are collected as words and converted in resolve_options, the same way as the file's values.
  for (const Setting& s : settings()) {
    const std::string name = Sources::cli_name(s);
    if (s.type_name == nullptr) {
      cmd->add_flag(name, s.help);
      continue;
    }
    CLI::Option* opt = cmd->add_option(name, s.help)->type_name(s.type_name);
    // One word per occurrence (a list option must not swallow MODEL_DIR); resolve_options refuses a
    // single-valued option given twice.
    opt->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  }
  cmd->callback([cmd] {
    const CLI::Option* config = cmd->get_option("--config");
    std::unique_ptr<ConfigFile> file;
    if (config->count() > 1) refuse("--config: given more than once; give one file");
    if (config->count() == 1) file = std::make_unique<ConfigFile>(config->results().front());
    run_kl_sweep_command(resolve_options(Sources(*cmd, file.get())));
  });
}

}  // namespace replayssm::cli
