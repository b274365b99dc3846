// replayssm logits MODEL_DIR --tokens ids.npy [--policy P] --out logprobs.npy
// Teacher-forced forward on the CPU or the GPU (--device): row t of the output is the model's next-token
// log-probability distribution after tokens[0..t] (float32, N x vocab), with every SSM layer's
// state stored and decoded under the precision policy. The output is streamed chunk by chunk to
// the io::NpyWriter's temporary, then renamed (atomic; never held in memory whole). An existing
// output is replaced only with --force.
#include <chrono>
#include <cmath>
#include <cstring>
#include <iostream>
#include <stdexcept>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "cli/commands.h"
#include "cli/engine_choice.h"
#include "io/npy.h"
#include "model/causal_lm.h"

#if REPLAYSSM_WITH_CUDA
#include "cuda_check.h"
#include "device_memory.h"
#include "model/gpu_causal_lm.h"
#endif

namespace replayssm::cli {
namespace {

struct LogitsOptions {
  std::string model_dir, tokens, out, policy = "conv:fp32";
  std::vector<std::string> layer_policies;
  int threads = 0, chunk = 256;
  bool raw = false, verbose = false, force = false;
  EngineChoice engine;
};

std::vector<int64_t> read_tokens(const std::string& path) {
  const io::NpyArray a = io::read_npy(path);
  if (a.shape.size() != 1 && !(a.shape.size() == 2 && a.shape[0] == 1))
    throw std::runtime_error(
        fmt::format("{}: token ids must be a 1-D array (or 1 x N), got {} dimensions", path, a.shape.size()));
  const std::size_t n = a.element_count();
  if (n == 0) throw std::runtime_error(fmt::format("{}: no token ids", path));
  std::vector<int64_t> t(n);
  if (a.dtype == "<i8") {
    std::memcpy(t.data(), a.data.data(), n * 8);
  } else if (a.dtype == "<i4") {
    for (std::size_t i = 0; i < n; ++i) {
      int32_t v;
      std::memcpy(&v, a.data.data() + 4 * i, 4);
      t[i] = v;
    }
  } else {
    throw std::runtime_error(
        fmt::format("{}: dtype is '{}', expected int32 ('<i4') or int64 ('<i8') token ids", path, a.dtype));
  }
  return t;
}

model::PolicyAssignment parse_policies(const LogitsOptions& o, const model::CausalLM& lm) {
  model::PolicyAssignment pa(ssm::PrecisionPolicy::parse(o.policy));
  for (const std::string& lp : o.layer_policies) {
    const auto eq = lp.find('=');
    if (eq == std::string::npos)
      throw std::runtime_error(fmt::format("--layer-policy '{}': expected LAYER=POLICY (e.g. 3=conv:fp16+sr)", lp));
    int layer = -1;
    try {
      layer = std::stoi(lp.substr(0, eq));
    } catch (const std::exception&) {
    }
    const int n = static_cast<int>(lm.config().layers.size());
    if (layer < 0 || layer >= n)
      throw std::runtime_error(fmt::format("--layer-policy '{}': layer must be an index in [0, {})", lp, n));
    const auto kind = lm.config().layers[layer];
    if (!model::is_ssm_layer(kind))
      throw std::runtime_error(fmt::format("--layer-policy '{}': layer {} is a {} layer, not an SSM layer", lp, layer,
                                           model::to_string(kind)));
    pa.per_layer[layer] = ssm::PrecisionPolicy::parse(lp.substr(eq + 1));
  }
  return pa;
}

void run_logits(const LogitsOptions& o) {
  const auto t0 = std::chrono::steady_clock::now();
  check_outputs({{"--out", o.out}}, {o.tokens}, o.force, "logits");
  const std::vector<int64_t> tokens = read_tokens(o.tokens);
  const model::CausalLM lm = model::CausalLM::load(o.model_dir);
  const model::PolicyAssignment policy = parse_policies(o, lm);
  std::vector<ssm::PrecisionPolicy> used{policy.all};
  for (const auto& [layer, p] : policy.per_layer) used.push_back(p);
  const bool on_gpu = choose_cuda(&lm, o.engine, std::cerr, "logits", used);
  const auto t1 = std::chrono::steady_clock::now();
  io::NpyWriter out(o.out, "<f4", {tokens.size(), static_cast<std::size_t>(lm.vocab_size())}, o.force);
  model::ForwardOptions fo;
  fo.threads = o.threads;
  fo.chunk_positions = o.chunk;
  fo.log_softmax = !o.raw;
  if (o.verbose)
    fo.on_layer_done = [](int, int layer, int n, double s) {
      std::cerr << fmt::format("  layer {}/{} done in {:.2f} s\n", layer + 1, n, s);
    };
  std::size_t nonfinite = 0;
  const auto write_rows = [&](const float* rows, std::size_t n) {
    for (std::size_t i = 0; i < n; ++i) nonfinite += !std::isfinite(rows[i]);
    out.write(rows, n * sizeof(float));
  };
  if (on_gpu) {
#if REPLAYSSM_WITH_CUDA
    // The GPU forward, then the LM head on the GPU chunk by chunk; each chunk's log-softmax on the
    // host with the CPU path's own function, so --device only changes the forward's rounding.
    const cuda::GpuCausalLM gpu(lm, gemm_precision(o.engine));
    std::cerr << fmt::format("logits: device: cuda, compute {}\n", o.engine.compute);
    const std::vector<int32_t> ids(tokens.begin(), tokens.end());
    const auto n = static_cast<int64_t>(ids.size());
    cuda::DeviceMatrixBuffer hidden(n, lm.config().hidden_size), logits;
    gpu.final_hidden(ids, policy, hidden.view(), fo.on_layer_done ? [&](int layer, int layers, double s) {
      fo.on_layer_done(0, layer, layers, s);
    } : std::function<void(int, int, double)>());
    model::Mat rows;
    for (int64_t p0 = 0; p0 < n; p0 += o.chunk) {
      const int64_t count = std::min<int64_t>(o.chunk, n - p0);
      logits.resize(count, lm.vocab_size());
      gpu.lm_logits(hidden.view().middle_rows(p0, count), logits.view());
      // The model's stream does not synchronise with the copy's default stream: wait for it.
      REPLAYSSM_CUDA_CHECK(cudaStreamSynchronize(gpu.stream()));
      const std::vector<float> host = cuda::to_host(logits.view());
      rows = Eigen::Map<const model::Mat>(host.data(), count, lm.vocab_size());
      if (!o.raw) model::log_softmax_rows(rows, o.threads);
      write_rows(rows.data(), static_cast<std::size_t>(rows.size()));
    }
#endif
  } else {
    lm.forward(tokens, {policy}, fo, [&](const model::LogitsChunk& c) {
      write_rows(c.rows[0], c.count * static_cast<std::size_t>(c.vocab));
    });
  }
  out.commit();
  const auto t2 = std::chrono::steady_clock::now();
  const double secs = std::chrono::duration<double>(t2 - t1).count();
  std::cerr << fmt::format(
      "{}: {} positions x {} under {} in {:.2f} s ({:.1f} tokens/s; load {:.2f} s), {} non-finite "
      "values -> {}\n",
      o.model_dir, tokens.size(), lm.vocab_size(), policy.to_string(), secs, static_cast<double>(tokens.size()) / secs,
      std::chrono::duration<double>(t1 - t0).count(), nonfinite, o.out);
}

}  // namespace

void register_logits(CLI::App& app) {
  auto o = std::make_shared<LogitsOptions>();
  CLI::App* cmd = app.add_subcommand(
      "logits",
      "Teacher-forced forward of a token sequence through a Hugging Face checkpoint on the CPU.\n"
      "Writes per-position next-token log-probabilities (float32, N x vocab; --raw: logits), with the\n"
      "state of every SSM layer stored/decoded under --policy (e.g. conv:fp32, shared:nvfp4+rtn@16,\n"
      "split:nvfp4/fp32@16).");
  cmd->add_option("MODEL_DIR", o->model_dir, "model directory (config.json + safetensors)")->required();
  cmd->add_option("--tokens", o->tokens, "token ids, .npy int32 or int64, shape (N,)")->required();
  cmd->add_option("--out", o->out, "output .npy (float32, N x vocab), written atomically")->required();
  cmd->add_flag("--force", o->force, "replace --out if it exists (never done without it)");
  cmd->add_option("--policy", o->policy, "precision policy of every SSM layer")->capture_default_str();
  cmd->add_option("--layer-policy", o->layer_policies, "LAYER=POLICY override for one SSM layer (repeatable)");
  cmd->add_option("--threads", o->threads, "worker threads (0: all hardware threads)")->capture_default_str();
  cmd->add_option("--chunk", o->chunk, "positions per LM-head chunk")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--device", o->engine.device, kDeviceHelp)->capture_default_str();
  cmd->add_option("--compute", o->engine.compute, kComputeHelp)->capture_default_str();
  cmd->add_flag("--raw", o->raw, "write raw logits instead of log-probabilities");
  cmd->add_flag("-v,--verbose", o->verbose, "report each layer's time on stderr");
  cmd->callback([o] { run_logits(*o); });
}

}  // namespace replayssm::cli
