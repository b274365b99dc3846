// replayssm quantize: float32 .npy in, dequantized float32 .npy out (optionally codes and scales),
// so researchers and other tools can cross-check the toolkit's quantizers.
#include <iostream>
#include <numeric>
#include <stdexcept>

#include <fmt/format.h>

#include "cli/commands.h"
#include "formats/quantized_matrix.h"
#include "io/npy.h"

namespace replayssm::cli {
namespace {

struct QuantizeOptions {
  std::string format = "nvfp4", rounding = "rtn", input, output, codes_out, scales_out, tensor_scale_out;
  uint64_t seed = 0, stream = 0;
};

void run_quantize(const QuantizeOptions& o) {
  using namespace formats;
  const StorageFormat format = parse_storage_format(o.format);
  const Rounding rounding = parse_rounding(o.rounding);
  const io::NpyArray in = io::read_npy_float32(o.input);
  if (in.shape.empty() || in.element_count() == 0)
    throw std::runtime_error(fmt::format("{}: expected a non-empty array of at least one dimension", o.input));
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
  io::write_npy_float32(o.output, in.shape, y.data());

  if (!o.codes_out.empty()) {
    const int bits = element_bits(format);
    if (bits == 32) {
      std::vector<uint32_t> c(q.size());
      for (std::size_t i = 0; i < c.size(); ++i) c[i] = q.element_code(i);
      io::write_npy(o.codes_out, "<u4", in.shape, c.data(), c.size() * 4);
    } else if (bits == 16) {
      std::vector<uint16_t> c(q.size());
      for (std::size_t i = 0; i < c.size(); ++i) c[i] = static_cast<uint16_t>(q.element_code(i));
      io::write_npy(o.codes_out, "<u2", in.shape, c.data(), c.size() * 2);
    } else {
      std::vector<uint8_t> c(q.size());
      for (std::size_t i = 0; i < c.size(); ++i) c[i] = static_cast<uint8_t>(q.element_code(i));
      io::write_npy(o.codes_out, "|u1", in.shape, c.data(), c.size());
    }
  }
  if (!o.scales_out.empty()) {
    std::vector<std::size_t> shape = in.shape;
    shape.back() = cols / static_cast<std::size_t>(block_size(format));
    if (format == StorageFormat::nvfp4)
      io::write_npy(o.scales_out, "|u1", shape, q.block_scale_codes.data(), q.block_scale_codes.size());
    else if (format == StorageFormat::fp8b128)
      io::write_npy_float32(o.scales_out, shape, q.block_scales.data());
    else
      throw std::runtime_error(fmt::format("--scales: format {} has no block scales (only nvfp4 and fp8b128 do)",
                                           to_string(format)));
  }
  if (!o.tensor_scale_out.empty()) {
    if (format != StorageFormat::nvfp4)
      throw std::runtime_error("--tensor-scale: only nvfp4 has a per-tensor scale");
    io::write_npy_float32(o.tensor_scale_out, {1}, &q.tensor_scale);
  }
  std::size_t nonfinite = 0;
  for (float v : y) nonfinite += !std::isfinite(v);
  std::cerr << fmt::format("quantized {} elements ({}x{}) to {} with {}{}: {} bytes stored, {} non-finite outputs\n",
                           x.size(), rows, cols, to_string(format), to_string(rounding),
                           rounding == Rounding::sr ? fmt::format(" (seed {}, stream {})", o.seed, o.stream) : "",
                           q.storage_bytes(), nonfinite);
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
  cmd->add_option("IN", opts->input, "input .npy (float32)")->required()->check(CLI::ExistingFile);
  cmd->add_option("OUT", opts->output, "output .npy (float32, dequantized)")->required();
  cmd->callback([opts] { run_quantize(*opts); });
}

}  // namespace replayssm::cli
