// replayssm quantize: float32 .npy in, dequantized float32 .npy out (optionally codes and scales),
// so researchers and other tools can cross-check the toolkit's quantizers.
#include <cmath>
#include <iostream>
#include <memory>
#include <numeric>
#include <stdexcept>

#include <fmt/format.h>

#include "cli/commands.h"
#include "formats/quantized_matrix.h"
#include "io/atomic_file.h"
#include "io/npy.h"

namespace replayssm::cli {
namespace {

struct QuantizeOptions {
  std::string format = "nvfp4", rounding = "rtn", input, output, codes_out, scales_out, tensor_scale_out;
  uint64_t seed = 0, stream = 0;
  bool force = false;
};

// One output array, held until every output is ready.
struct PlannedOutput {
  std::string path, dtype;
  std::vector<std::size_t> shape;
  const void* data;
  std::size_t bytes;
};

void run_quantize(const QuantizeOptions& o) {
  using namespace formats;
  const StorageFormat format = parse_storage_format(o.format);
  const Rounding rounding = parse_rounding(o.rounding);
  // Every option and output is checked before the input is read and before anything is written.
  if (!o.scales_out.empty() && format != StorageFormat::nvfp4 && format != StorageFormat::fp8b128)
    throw std::invalid_argument(fmt::format(
        "--scales: format {} has no block scales (only nvfp4 and fp8b128 do)", to_string(format)));
  if (!o.tensor_scale_out.empty() && format != StorageFormat::nvfp4)
    throw std::invalid_argument(
        fmt::format("--tensor-scale: format {} has no per-tensor scale (only nvfp4 does)", to_string(format)));
  std::vector<std::pair<std::string, std::string>> outputs = {{"OUT", o.output}};
  if (!o.codes_out.empty()) outputs.emplace_back("--codes", o.codes_out);
  if (!o.scales_out.empty()) outputs.emplace_back("--scales", o.scales_out);
  if (!o.tensor_scale_out.empty()) outputs.emplace_back("--tensor-scale", o.tensor_scale_out);
  check_outputs(outputs, {o.input}, o.force, "quantize");

  const io::NpyArray in = io::read_npy_float32(o.input);
  if (in.shape.empty() || in.element_count() == 0)
    throw std::runtime_error(fmt::format("{}: shape {} has no elements or no dimension: expected a non-empty array "
                                         "of at least one dimension (the last one is quantized in blocks)",
                                         o.input, io::shape_text(in.shape)));
  const std::size_t cols = in.shape.back();
  const std::size_t rows = in.element_count() / cols;
  const std::vector<float> x = io::as_floats(in);
  QuantizedMatrix q;
  try {
    q = quantize_matrix(x.data(), rows, cols, format, rounding, SrKey{o.seed, o.stream});
  } catch (const std::invalid_argument& e) {
    throw std::runtime_error(fmt::format("{}: {}", o.input, e.what()));
  }
  std::vector<float> y(x.size());
  dequantize_matrix(q, y.data());

  std::vector<PlannedOutput> planned = {{o.output, "<f4", in.shape, y.data(), y.size() * sizeof(float)}};
  // Codes in the narrowest unsigned type that holds them (e2m1: one code per byte).
  std::vector<uint8_t> codes8;
  std::vector<uint16_t> codes16;
  std::vector<uint32_t> codes32;
  if (!o.codes_out.empty()) {
    const int bits = element_bits(format);
    for (std::size_t i = 0; i < q.size(); ++i) {
      const uint32_t c = q.element_code(i);
      if (bits == 32) codes32.push_back(c);
      else if (bits == 16) codes16.push_back(static_cast<uint16_t>(c));
      else codes8.push_back(static_cast<uint8_t>(c));
    }
    if (bits == 32)
      planned.push_back({o.codes_out, "<u4", in.shape, codes32.data(), codes32.size() * 4});
    else if (bits == 16)
      planned.push_back({o.codes_out, "<u2", in.shape, codes16.data(), codes16.size() * 2});
    else
      planned.push_back({o.codes_out, "|u1", in.shape, codes8.data(), codes8.size()});
  }
  if (!o.scales_out.empty()) {
    std::vector<std::size_t> shape = in.shape;
    shape.back() = cols / static_cast<std::size_t>(block_size(format));
    if (format == StorageFormat::nvfp4)
      planned.push_back({o.scales_out, "|u1", shape, q.block_scale_codes.data(), q.block_scale_codes.size()});
    else
      planned.push_back({o.scales_out, "<f4", shape, q.block_scales.data(), q.block_scales.size() * sizeof(float)});
  }
  if (!o.tensor_scale_out.empty()) planned.push_back({o.tensor_scale_out, "<f4", {1}, &q.tensor_scale, sizeof(float)});

  // All or none: every temporary is written and synced before the first is renamed.
  std::vector<std::unique_ptr<io::NpyWriter>> writers;
  std::vector<io::AtomicFile*> files;
  for (const PlannedOutput& p : planned) {
    writers.push_back(std::make_unique<io::NpyWriter>(p.path, p.dtype, p.shape, o.force));
    writers.back()->write(p.data, p.bytes);
    writers.back()->finish();
    files.push_back(&writers.back()->file());
  }
  io::commit_together(files);

  std::size_t nonfinite_in = 0, nonfinite_out = 0;
  for (float v : x) nonfinite_in += !std::isfinite(v);
  for (float v : y) nonfinite_out += !std::isfinite(v);
  std::cerr << fmt::format(
      "quantized {} elements ({}x{}) to {} with {}{}: {} bytes stored, {} non-finite inputs, {} non-finite outputs\n",
      x.size(), rows, cols, to_string(format), to_string(rounding),
      rounding == Rounding::sr ? fmt::format(" (seed {}, stream {})", o.seed, o.stream) : "", q.storage_bytes(),
      nonfinite_in, nonfinite_out);
}

}  // namespace

void register_quantize(CLI::App& app) {
  auto opts = std::make_shared<QuantizeOptions>();
  CLI::App* cmd = app.add_subcommand(
      "quantize",
      "Quantize a float32 .npy array and write the dequantized float32 values.\n"
      "The last dimension is the contiguous one: block formats need it to be a multiple of the block\n"
      "size (nvfp4: 16, fp8b128: 128); stochastic rounding counts elements in C order.");
  cmd->add_option("--format", opts->format, "nvfp4 | fp8b128 | e4m3 | e2m1 | fp16 | bf16 | fp32")
      ->capture_default_str();
  cmd->add_option("--rounding", opts->rounding, "rtn (round to nearest even) | sr (stochastic)")->capture_default_str();
  cmd->add_option("--seed", opts->seed, "stochastic rounding seed")->capture_default_str();
  cmd->add_option("--stream", opts->stream, "stochastic rounding stream id")->capture_default_str();
  cmd->add_option("--codes", opts->codes_out, "also write element codes (.npy: uint8, uint16 or uint32)");
  cmd->add_option("--scales", opts->scales_out,
                  "also write block scales (.npy: nvfp4 E4M3 codes as uint8, fp8b128 float32)");
  cmd->add_option("--tensor-scale", opts->tensor_scale_out, "also write the nvfp4 FP32 tensor scale (.npy)");
  cmd->add_flag("--force", opts->force, "replace outputs that already exist (never done without it)");
  cmd->add_option("IN", opts->input, "input .npy (float32)")->required()->check(CLI::ExistingFile);
  cmd->add_option("OUT", opts->output, "output .npy (float32, dequantized), written atomically with the others")
      ->required();
  cmd->callback([opts] { run_quantize(*opts); });
}

}  // namespace replayssm::cli
