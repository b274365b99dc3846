// replayssm kl-sweep: the teacher-forced KL of every configuration against the FP32 reference on
// PG-19 books (REPLAYSSM.md section 10), written to an HDF5 result file (io/hdf5_results.h) that
// scripts/plot_kl.py turns into the paper's figures. Options come from flags or a TOML file
// (--config experiments/fig5.toml); flags given on the command line win over the file.
//
// The TOML file is read with CLI11's own TOML reader (CLI::ConfigTOML) and its values are given to
// the subcommand's options: CLI11's App::set_config handles config files for the top-level app
// only, and the top-level app belongs to every subcommand.
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "cli/commands.h"
#include "eval/kl_sweep.h"
#include "model/teacher_forced_model.h"
#include "io/text_source.h"


namespace replayssm::cli {
namespace {

struct KlSweepOptions {
  std::string config_file, model_dir, text_dir, tokens_dir, out, short_books = "error", progress = "auto";
  std::string reference = "conv:fp32";
  int books = 0, chunk = 1024, threads = 0;
  int64_t length = 0;
  int32_t byte_offset = 0;
  std::vector<std::string> policies;
  std::vector<int> windows;
  std::vector<uint64_t> seeds;
  bool force = false, dry_run = false;
};

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

// Gives the TOML settings of `path` to the options of `cmd` that the command line left unset.
// Keys are the long option names without "--" (text-dir, length, policies = [...], force = true)
// and model-dir for MODEL_DIR; top level or in a [kl-sweep] table.
void apply_config_file(CLI::App& cmd, const std::string& path) {
  std::vector<CLI::ConfigItem> items;
  try {
    items = CLI::ConfigTOML().from_file(path);
  } catch (const CLI::Error& e) {
    throw std::runtime_error(fmt::format("--config {}: {}", path, e.what()));
  }
  for (const CLI::ConfigItem& item : items) {
    if (item.name == "++" || item.name == "--") continue;  // table open/close markers
    if (!item.parents.empty() && !(item.parents.size() == 1 && item.parents[0] == "kl-sweep"))
      throw std::runtime_error(fmt::format("--config {}: unknown table '{}' (settings go at the top level or in "
                                           "[kl-sweep])",
                                           path, item.parents[0]));
    const bool model = item.name == "model-dir" || item.name == "model_dir" || item.name == "MODEL_DIR";
    CLI::Option* opt = model ? cmd.get_option_no_throw("MODEL_DIR") : cmd.get_option_no_throw("--" + item.name);
    if (opt == nullptr || item.name == "config" || item.name == "help")
      throw std::runtime_error(fmt::format(
          "--config {}: unknown setting '{}' (settings are the kl-sweep options without '--', e.g. text-dir, "
          "length, policies, windows, out; and model-dir)",
          path, item.fullname()));
    if (opt->count() > 0) continue;  // the command line wins
    if (opt->get_expected_min() == 0) {
      if (item.inputs.size() != 1)
        throw std::runtime_error(fmt::format("--config {}: '{}' takes true or false", path, item.name));
      opt->add_result(item.inputs.front());
    } else {
      opt->add_result(item.inputs);
    }
    opt->run_callback();
  }
}

void require(bool given, const std::string& what) {
  if (!given)
    throw std::invalid_argument(fmt::format("kl-sweep: {} is required (on the command line or in the --config file)",
                                            what));
}

void run_kl_sweep_command(const KlSweepOptions& o) {
  require(!o.model_dir.empty(), "MODEL_DIR");
  require(!o.text_dir.empty(), "--text-dir");
  require(o.length != 0, "--length");
  require(!o.out.empty(), "--out");
  std::vector<std::string> specs;
  for (const auto& p : o.policies)
    for (auto& s : eval::split_policy_list(p)) specs.push_back(std::move(s));
  if (specs.empty()) specs = eval::default_policy_specs();
  const std::vector<ssm::PrecisionPolicy> policies = eval::expand_policies(specs, o.windows, o.seeds);
  if (o.length < 1) throw std::invalid_argument(fmt::format("--length must be at least 1, got {}", o.length));

  io::TextSourceOptions to;
  to.text_dir = o.text_dir;
  to.tokens_dir = o.tokens_dir;
  to.byte_offset = o.byte_offset;
  to.length = o.length;
  to.max_books = o.books;
  to.short_books = io::parse_short_books(o.short_books);
  io::LoadedBooks loaded = io::load_books(to);

  std::cerr << fmt::format("kl-sweep: {} book{} from {} ({}), N = {} positions each\n", loaded.books.size(),
                           loaded.books.size() == 1 ? "" : "s", o.text_dir, loaded.tokenization, o.length);
  for (const auto& b : loaded.books)
    std::cerr << fmt::format("  {:<12} {:>9} tokens{}\n", b.name, b.tokens.size(),
                             b.header_found ? "" : "  (no Gutenberg header: taken whole)");
  for (const auto& s : loaded.skipped) std::cerr << "  skipped " << s << "\n";
  std::cerr << fmt::format("kl-sweep: reference {}; {} configuration{}:\n", o.reference, policies.size(),
                           policies.size() == 1 ? "" : "s");
  for (const auto& p : policies) std::cerr << "  " << p.to_string() << "\n";
  if (o.dry_run) {
    std::cerr << "kl-sweep: --dry-run: stopping before loading the model\n";
    return;
  }

  std::unique_ptr<model::TeacherForcedModel> model = model::load_teacher_forced_model(o.model_dir);
  std::cerr << fmt::format("kl-sweep: model {} ({}; vocabulary {}, hidden {})\n", o.model_dir, model->description(),
                           model->vocab_size(), model->hidden_size());

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
  so.threads = o.threads;
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
  const eval::SweepOutcome r = eval::run_kl_sweep(*model, books, so);
  std::cout << eval::format_summary_table(r.rows);
  std::cout << fmt::format("results: {} ({} cells: {} computed now, {} from an earlier run; {})\n", r.path,
                           r.cells_total, r.cells_run, r.cells_resumed, eval::human_duration(r.seconds));
}

}  // namespace

void register_kl_sweep(CLI::App& app) {
  auto o = std::make_shared<KlSweepOptions>();
  CLI::App* cmd = app.add_subcommand(
      "kl-sweep",
      "Teacher-forced KL of low-precision state configurations against FP32 conventional decode on PG-19 books\n"
      "(REPLAYSSM.md section 10). Writes an HDF5 result file (docs/KL_SWEEP.md); an interrupted sweep resumes\n"
      "where it stopped when run again with the same settings.");
  cmd->add_option("--config", o->config_file,
                  "TOML file with any of the options below, keys without '--' (e.g. experiments/fig5.toml); "
                  "the command line wins")
      ->check(CLI::ExistingFile);
  cmd->add_option("MODEL_DIR", o->model_dir,
                  "Hugging Face checkpoint directory (config.json + safetensors); required (or model-dir in --config)");
  cmd->add_option("--text-dir", o->text_dir,
                  "folder of PG-19 .txt books (Gutenberg boilerplate is stripped); required");
  cmd->add_option("--tokens-dir", o->tokens_dir,
                  "token ids written by scripts/tokenize.py with the model's tokenizer (default: byte-level ids)");
  cmd->add_option("--byte-offset", o->byte_offset, "byte-level ids: id = byte value + offset")->capture_default_str();
  cmd->add_option("--books", o->books, "number of books, the first in name order (0: all)")->capture_default_str();
  cmd->add_option("--length", o->length, "N: positions per book (each book needs N + 1 tokens); required");
  cmd->add_option("--short-books", o->short_books, "a book shorter than N + 1 tokens: error | skip")
      ->capture_default_str()
      ->check(CLI::IsMember({"error", "skip"}));
  cmd->add_option("--policies", o->policies,
                  "configurations, comma-separated (default: the paper's set); without '@L' shared/split "
                  "policies are expanded over --windows");
  cmd->add_option("--windows", o->windows, "windows L for policies given without '@L' (default 16)")
      ->delimiter(',');
  cmd->add_option("--seeds", o->seeds, "stochastic-rounding seeds for SR policies without ',seed=' (default 0)")
      ->delimiter(',');
  cmd->add_option("--out", o->out, "result file (.h5); required");
  cmd->add_flag("--force", o->force, "replace an existing result file or discard a different sweep's partial results");
  cmd->add_option("--reference", o->reference, "reference policy")->capture_default_str();
  cmd->add_option("--chunk", o->chunk, "positions per log-probability chunk (memory: chunk x vocab floats x 2)")
      ->capture_default_str();
  cmd->add_option("--threads", o->threads, "KL worker threads (0: all cores)")->capture_default_str();
  cmd->add_option("--progress", o->progress, "auto | bar | lines | off")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "bar", "lines", "off"}));
  cmd->add_flag("--dry-run", o->dry_run, "load the books and expand the configurations, then stop (no model)");
  cmd->callback([o, cmd] {
    if (!o->config_file.empty()) apply_config_file(*cmd, o->config_file);
    run_kl_sweep_command(*o);
  });
}

}  // namespace replayssm::cli
