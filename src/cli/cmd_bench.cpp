// replayssm bench: times the CUDA decode kernels (see cuda/bench/decode_bench.h).
#include <memory>
#include <stdexcept>
#include <string>

#include "cli/commands.h"
#if REPLAYSSM_WITH_CUDA
#include "bench/decode_bench.h"
#include "ssm/model_shapes.h"
#endif

namespace replayssm::cli {

void register_bench(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand(
      "bench",
      "Time the CUDA decode kernels (conventional, ReplaySSM standard decode, low-precision reads,\n"
      "speculative verification, Algorithm 3) on the paper's model shapes, against the measured copy\n"
      "bandwidth and the conventional kernel of the same run. Also the policy modifiers: error feedback\n"
      "(+ef: conventional fp16+ef, a split flush writing an nvfp4+ef copy) and appendix F read skipping\n"
      "(skip=auto with 0, 50 and 100% of heads below the threshold, and a pure-write flush), each against\n"
      "the same kernel without it. Every configuration is checked against the CPU decoders first.\n"
      "--schemes: figure 7's prior speculative schemes instead. Needs a CUDA build and a GPU.");
#if REPLAYSSM_WITH_CUDA
  auto o = std::make_shared<cuda::BenchOptions>();
  cmd->add_option("--shapes", o->shapes, "model shapes (replayssm traffic --shape all lists them)")->capture_default_str();
  cmd->add_option("--batch", o->batches, "batch sizes B")->capture_default_str();
  cmd->add_option("--window", o->windows, "windows L")->capture_default_str();
  cmd->add_option("--drafts", o->drafts, "draft counts T for verification (1, 2, 4, 8)")->capture_default_str();
  cmd->add_option("--repeats", o->repeats, "timed repetitions per measurement (median reported)")->capture_default_str();
  cmd->add_option("--csv", o->csv_out, "also write every measurement as CSV (written atomically at the end)");
  cmd->add_flag("--force", o->force, "replace --csv if it exists (never done without it)");
  cmd->add_flag("--no-check{false}", o->check,
                "skip the validation of each kernel against the CPU decoders that runs before it is timed");
  cmd->add_flag("--no-flush-list{false}", o->flush_lists,
                "run the standard replay step without ReplayConfig::flush_list (the flush kernel then puts blocks on\n"
                "every sequence), for comparison with the default");
  cmd->add_option("--heads-per-block", o->heads_per_block,
                  "value heads per block of the standard replay step (0: the launcher's choice; must divide the\n"
                  "heads per key head, heads x dv <= 1024)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  cmd->add_option("--flush-heads-per-block", o->flush_heads_per_block,
                  "value heads per block of the standard replay step's flush kernel alone (0: as --heads-per-block;\n"
                  "Mamba-2 and GDN shapes)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  auto timer = std::make_shared<std::string>("queued");
  cmd->add_option("--timer", *timer,
                  "queued: each sample's work is queued behind a kernel that holds the GPU until the host has\n"
                  "launched it all, so the time is the GPU's alone (as bench_peers.py --timer graph); events: the\n"
                  "events also bracket the host's launch calls (every run before this option)")
      ->check(CLI::IsMember({"queued", "events"}))
      ->capture_default_str();
  cmd->add_option("--arena-gib", o->arena_gib,
                  "device memory for the bench's buffers in GiB (0: all that is free but max(1/4, 2 GiB)); give a\n"
                  "few GiB under Nsight Compute, which saves the memory a replayed kernel may write")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  cmd->add_option("--rows", o->rows,
                  "time only the rows whose label matches this regular expression (ECMAScript, searched in the\n"
                  "label), and the rows they are measured against, e.g. --rows 'non-flush read nvfp4'. Each row is\n"
                  "timed inside an NVTX range named by its label ('/' written as '|'), so Nsight Compute takes one\n"
                  "row's kernels with --nvtx --nvtx-include '<label>/'");
  CLI::Option* shapes = cmd->get_option("--shapes");
  CLI::Option* batches = cmd->get_option("--batch");
  CLI::Option* drafts = cmd->get_option("--drafts");
  cmd->add_flag("--schemes", o->schemes,
                "figure 7 alone (paper appendix A): one verify step + state recovery of The Mamba in the Llama,\n"
                "Snakes and Ladders (activation replay, joint attainment) and STree beside ReplaySSM's verify and\n"
                "the vLLM snapshots, for a = 1 and a = T, in conventional steps; unless given, --shapes\n"
                "nemotron-3-super --batch 256 --drafts 2 4 8");
  cmd->callback([o, shapes, batches, drafts, timer] {
    o->timer = *timer == "events" ? cuda::BenchOptions::Timer::events : cuda::BenchOptions::Timer::queued;
    if (o->schemes) {  // the paper's setting unless the command line says otherwise
      if (shapes->count() == 0) o->shapes = {"nemotron-3-super"};
      if (batches->count() == 0) o->batches = {256};
      if (drafts->count() == 0) o->drafts = {2, 4, 8};
      // Refused before any GPU work: the prior schemes and the snapshot baseline have scalar decays only.
      for (const std::string& name : o->shapes)
        if (ssm::find_shape(name).kind == ssm::Recurrence::kda)
          throw std::invalid_argument("bench --schemes: shape '" + name +
                                      "' has KDA (channel-wise) decays; the prior schemes and the snapshot baseline "
                                      "are written for Mamba-2 and GDN shapes");
    }
    // The output is checked before any GPU work, like the options (check_bench_options): a run of
    // minutes must not end in a refused write, nor replace an earlier run's results.
    if (!o->csv_out.empty()) check_outputs({{"--csv", o->csv_out}}, {}, o->force, "bench");
    cuda::run_decode_bench(*o);
  });
#else
  cmd->callback([] {
    throw std::runtime_error("this build has no CUDA kernels: configure with -DREPLAYSSM_CUDA=ON on a machine with nvcc");
  });
#endif
}

}  // namespace replayssm::cli
