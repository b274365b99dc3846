#include "model/quantized_weights.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <regex>
#include <sstream>
#include <stdexcept>

#include <fmt/format.h>

#include "formats/block_scaled.h"
#include "formats/element_formats.h"
#include "model/json_util.h"

namespace replayssm::model {
namespace {

using formats::ElementFormat;

[[noreturn]] void fail(const std::string& what) { throw std::runtime_error(what); }

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

void add_unique(std::vector<std::string>& to, const std::vector<std::string>& from) {
  for (const std::string& s : from)
    if (std::find(to.begin(), to.end(), s) == to.end()) to.push_back(s);
}

// One of the integer sizes of a config (block or group size): a positive integer or an error.
int positive_size(const nlohmann::json& v, const std::string& where, const std::string& field,
                  const std::string& expected) {
  if (!v.is_number_integer() || v.get<int64_t>() <= 0 || v.get<int64_t>() > (1 << 20))
    fail(fmt::format("{}: \"{}\" is {}, expected {}", where, field, printable(v.dump()), expected));
  return static_cast<int>(v.get<int64_t>());
}

void load_fp8(const JsonObject& qc, WeightQuantization& q) {
  q.format = WeightFormat::fp8_block;
  q.source = qc.where();
  const std::string fmt_name = qc.get_string("fmt", "e4m3");
  if (fmt_name != "e4m3")
    fail(fmt::format("{}: \"fmt\" is '{}', expected \"e4m3\" (FP8 E4M3 weights; other FP8 formats are not supported)",
                     qc.where(), printable(fmt_name)));
  if (!qc.has("weight_block_size"))
    fail(fmt::format("{}: missing \"weight_block_size\" (expected [rows, cols] of the weight blocks, e.g. [128, 128]; "
                     "per-tensor FP8 scales are not supported)",
                     qc.where()));
  const nlohmann::json& b = qc.json()["weight_block_size"];
  const std::string expected = "[rows, cols], two positive integers (e.g. [128, 128])";
  if (!b.is_array() || b.size() != 2)
    fail(fmt::format("{}: \"weight_block_size\" is {}, expected {}", qc.where(), printable(b.dump()), expected));
  q.block_rows = positive_size(b[0], qc.where(), "weight_block_size", expected);
  q.block_cols = positive_size(b[1], qc.where(), "weight_block_size", expected);
  q.activation_scheme = qc.get_string("activation_scheme", "dynamic");
  if (q.activation_scheme != "dynamic")
    fail(fmt::format("{}: \"activation_scheme\" is '{}', expected \"dynamic\" (static activation scales are not "
                     "supported)",
                     qc.where(), printable(q.activation_scheme)));
  const std::string scale_fmt = qc.get_string("scale_fmt", "float");
  if (scale_fmt != "float")
    fail(fmt::format("{}: \"scale_fmt\" is '{}', expected \"float\" (float32 weight_scale_inv; UE8M0 scales are not "
                     "supported)",
                     qc.where(), printable(scale_fmt)));
  for (const char* key : {"modules_to_not_convert", "ignored_layers"})
    if (qc.has(key)) add_unique(q.excluded, qc.get_string_list(key));
}

// ModelOpt NVFP4 from config.json's quantization_config (`qc`) and/or hf_quant_config.json's
// "quantization" (`hq`); where both are present they must agree.
void load_nvfp4(const std::optional<JsonObject>& qc, const std::optional<JsonObject>& hq, WeightQuantization& q) {
  q.format = WeightFormat::nvfp4;
  q.source = qc && hq ? qc->where() + " and " + hq->where() : (qc ? qc->where() : hq->where());
  std::string algo;
  for (const auto* o : {qc ? &*qc : nullptr, hq ? &*hq : nullptr}) {
    if (!o) continue;
    if (!o->has("quant_algo"))
      fail(fmt::format("{}: missing \"quant_algo\" (expected \"NVFP4\")", o->where()));
    const std::string a = o->get_string("quant_algo");
    if (a != "NVFP4")
      fail(fmt::format("{}: \"quant_algo\" is '{}', expected \"NVFP4\" (the ModelOpt algorithm this toolkit reads; "
                       "FP8 checkpoints are read with quant_method \"fp8\" and weight_block_size)",
                       o->where(), printable(a)));
    algo = a;
  }
  // Group sizes: ModelOpt's default 16 where none is given; every one given must be 16.
  q.group_size = formats::kNvfp4BlockSize;
  auto check_group = [&](const nlohmann::json& v, const std::string& where, const std::string& field) {
    const std::string expected = fmt::format("{} (NVFP4's block of E2M1 codes per E4M3 scale)", formats::kNvfp4BlockSize);
    if (positive_size(v, where, field, expected) != formats::kNvfp4BlockSize)
      fail(fmt::format("{}: \"{}\" is {}, expected {}", where, field, v.dump(), expected));
  };
  for (const auto* o : {qc ? &*qc : nullptr, hq ? &*hq : nullptr})
    if (o && o->has("group_size")) check_group(o->json()["group_size"], o->where(), "group_size");
  if (qc && qc->has("config_groups")) {
    const nlohmann::json& groups = qc->json()["config_groups"];
    if (!groups.is_object())
      fail(fmt::format("{}: \"config_groups\" is not an object (expected {{name: {{\"weights\": {{...}}}}}})",
                       qc->where()));
    for (auto it = groups.begin(); it != groups.end(); ++it) {
      const nlohmann::json& g = it.value();
      if (g.is_object() && g.contains("weights") && g["weights"].is_object() && g["weights"].contains("group_size") &&
          !g["weights"]["group_size"].is_null())
        check_group(g["weights"]["group_size"], qc->where(), "config_groups." + it.key() + ".weights.group_size");
    }
  }
  for (const auto* o : {qc ? &*qc : nullptr, hq ? &*hq : nullptr}) {
    if (!o) continue;
    for (const char* key : {"ignore", "exclude_modules"})
      if (o->has(key)) add_unique(q.excluded, o->get_string_list(key));
  }
  // FP8 KV cache: its k_scale / v_scale tensors are recorded (the KV cache is FP32 here).
  std::string kv;
  if (hq && hq->has("kv_cache_quant_algo")) kv = hq->get_string("kv_cache_quant_algo");
  if (qc && qc->has("kv_cache_scheme")) {
    const nlohmann::json& s = qc->json()["kv_cache_scheme"];
    const bool fp8 = s.is_string() ? s.get<std::string>() == "FP8"
                                   : s.is_object() && s.value("num_bits", 0) == 8 && s.value("type", "") == "float";
    if (!fp8)
      fail(fmt::format("{}: \"kv_cache_scheme\" is {}, expected FP8 ({{\"num_bits\": 8, \"type\": \"float\"}}) or null",
                       qc->where(), printable(s.dump())));
    kv = "FP8";
  }
  if (!kv.empty() && kv != "FP8")
    fail(fmt::format("{}: \"kv_cache_quant_algo\" is '{}', expected \"FP8\" or null", hq->where(), printable(kv)));
  q.kv_cache_quant_algo = kv;
  q.activation_scheme = "static (per-tensor input_scale)";
}

std::string dtype_list(std::initializer_list<const char*> d) { return fmt::format("{}", fmt::join(d, " or ")); }

bool is_one_of(const std::string& d, std::initializer_list<const char*> allowed) {
  for (const char* a : allowed)
    if (d == a) return true;
  return false;
}

// Float32 value of a scalar tensor ([] or [1]) of dtype F32.
float scalar_f32(const TensorStore::Stored& s) {
  float v;
  std::memcpy(&v, s.file->bytes(*s.info), 4);
  return v;
}

// Layer indices folded: "model.layers.3.mlp.up_proj.weight" -> "model.layers.*.mlp.up_proj.weight".
std::string folded(const std::string& name) {
  static const std::regex index(R"(\.\d+\.)");
  return std::regex_replace(name, index, ".*.");
}

std::string mib(uint64_t bytes) { return fmt::format("{:.2f} MiB", static_cast<double>(bytes) / (1024.0 * 1024.0)); }

// name x count, in order of first appearance.
std::string folded_list(const std::vector<std::string>& names, const std::string& indent) {
  std::vector<std::pair<std::string, int>> groups;
  for (const std::string& n : names) {
    const std::string f = folded(n);
    auto it = std::find_if(groups.begin(), groups.end(), [&](const auto& g) { return g.first == f; });
    if (it == groups.end())
      groups.emplace_back(f, 1);
    else
      ++it->second;
  }
  std::string out;
  for (const auto& [f, n] : groups) out += fmt::format("{}{} x{}\n", indent, f, n);
  return out;
}

}  // namespace

std::string to_string(WeightFormat f) { return f == WeightFormat::fp8_block ? "FP8 E4M3 block-scaled" : "NVFP4"; }

WeightQuantization WeightQuantization::load(const std::string& model_dir) {
  namespace fs = std::filesystem;
  WeightQuantization q;
  const std::string config_path = (fs::path(model_dir) / "config.json").string();
  const nlohmann::json config = read_json_file(config_path);
  std::optional<JsonObject> qc, hq;
  if (config.is_object() && config.contains("quantization_config") && !config["quantization_config"].is_null()) {
    if (!config["quantization_config"].is_object())
      fail(fmt::format("{}: \"quantization_config\" is not an object (expected {{\"quant_method\": ...}})",
                       config_path));
    qc.emplace(config["quantization_config"], config_path + ": quantization_config");
  }
  const fs::path hq_path = fs::path(model_dir) / "hf_quant_config.json";
  if (fs::exists(hq_path) || fs::is_symlink(hq_path)) {
    const nlohmann::json j = read_json_file(hq_path.string());
    if (!j.is_object() || !j.contains("quantization") || !j["quantization"].is_object())
      fail(fmt::format("{}: missing \"quantization\" object (expected {{\"quant_algo\": \"NVFP4\", ...}})",
                       hq_path.string()));
    hq.emplace(j["quantization"], hq_path.string() + ": quantization");
  }
  if (!qc && !hq) return q;
  const std::string method = qc ? qc->get_string("quant_method", "") : "modelopt";
  if (method == "fp8") {
    if (hq)
      fail(fmt::format("{}: quant_method is \"fp8\" but {} describes a ModelOpt quantization (expected one of them)",
                       qc->where(), hq_path.string()));
    load_fp8(*qc, q);
  } else if (method == "modelopt") {
    load_nvfp4(qc, hq, q);
  } else {
    fail(fmt::format("{}: {} (expected \"fp8\" for block-scaled FP8 E4M3 weights or \"modelopt\" with quant_algo "
                     "\"NVFP4\")",
                     qc->where(),
                     method.empty() ? std::string("missing \"quant_method\"")
                                    : fmt::format("unknown \"quant_method\" '{}'", printable(method))));
  }
  return q;
}

QuantizedWeightReader::QuantizedWeightReader(TensorStore& store, WeightQuantization quantization)
    : store_(store), q_(std::move(quantization)) {
  if (!q_.format) throw std::logic_error("QuantizedWeightReader: the checkpoint is not quantized");
}

bool QuantizedWeightReader::holds(const std::string& name) const {
  const auto w = store_.stored(name);
  if (!w) return false;
  if (is_one_of(w->info->dtype, {"F8_E4M3", "U8"})) return true;
  for (const char* suffix : {"_scale_inv", "_scale", "_scale_2"})
    if (store_.contains(name + suffix)) return true;
  return false;
}

std::vector<float> QuantizedWeightReader::dequantize(const std::string& name, int64_t rows, int64_t cols,
                                                     bool shapes_only) {
  return *q_.format == WeightFormat::fp8_block ? fp8_block(name, rows, cols, shapes_only)
                                               : nvfp4(name, rows, cols, shapes_only);
}

std::vector<float> QuantizedWeightReader::fp8_block(const std::string& name, int64_t rows, int64_t cols,
                                                    bool shapes_only) {
  const TensorStore::Stored w = *store_.stored(name);
  const std::string& file = w.file->path();
  const std::string scale_name = w.info->name + "_scale_inv";  // stored names, in lookups and messages
  if (w.info->dtype != "F8_E4M3")
    fail(fmt::format("{}: tensor '{}' has dtype {}, expected F8_E4M3 (FP8 E4M3 codes: {} declares block-scaled FP8, "
                     "and the weight has a '{}')",
                     file, w.info->name, w.info->dtype, q_.source, scale_name));
  if (w.info->shape != std::vector<int64_t>{rows, cols})
    fail(fmt::format("{}: tensor '{}' has shape {}, expected [{}, {}]", file, w.info->name, shape_string(w.info->shape),
                     rows, cols));
  const int64_t br = q_.block_rows, bc = q_.block_cols;
  const int64_t scale_rows = ceil_div(rows, br), scale_cols = ceil_div(cols, bc);
  const auto s = store_.stored(scale_name);
  if (!s)
    fail(fmt::format("{}: missing tensor '{}' (expected F32 [{}, {}]: the {}x{} block scales of the F8_E4M3 weight "
                     "'{}')",
                     store_.files_description(), scale_name, scale_rows, scale_cols, br, bc, w.info->name));
  if (!is_one_of(s->info->dtype, {"F32", "BF16", "F16"}))
    fail(fmt::format("{}: tensor '{}' has dtype {}, expected F32 (or BF16, F16): block scales of '{}'",
                     s->file->path(), s->info->name, s->info->dtype, w.info->name));
  if (s->info->shape != std::vector<int64_t>{scale_rows, scale_cols})
    fail(fmt::format("{}: tensor '{}' has shape {}, expected [{}, {}] (ceil([{}, {}] / weight_block_size [{}, {}]))",
                     s->file->path(), s->info->name, shape_string(s->info->shape), scale_rows, scale_cols, rows, cols,
                     br, bc));
  store_.mark_used(name);
  store_.mark_used(scale_name);
  const std::vector<float> scales = s->file->read_float32(*s->info);
  for (std::size_t i = 0; i < scales.size(); ++i)
    if (!std::isfinite(scales[i]) || std::signbit(scales[i]))
      fail(fmt::format("{}: tensor '{}' block [{}, {}] holds {}, expected a finite, non-negative scale",
                       s->file->path(), s->info->name, static_cast<int64_t>(i) / scale_cols,
                       static_cast<int64_t>(i) % scale_cols, scales[i]));
  const uint8_t* codes = w.file->bytes(*w.info);
  const std::size_t n = static_cast<std::size_t>(rows * cols);
  int64_t nan_codes = 0;
  for (std::size_t i = 0; i < n; ++i) nan_codes += (codes[i] & 0x7Fu) == formats::kE4m3NanCode;
  if (nan_codes) non_finite_.push_back(NonFiniteTensor{w.info->name, file, nan_codes, rows * cols});
  dequantized_.push_back(DequantizedWeight{w.info->name, file, WeightFormat::fp8_block, rows, cols,
                                           (w.info->end - w.info->begin) + (s->info->end - s->info->begin)});
  if (shapes_only) return {};
  std::vector<float> out(n);
  for (int64_t r = 0; r < rows; ++r) {
    const float* block_scales = scales.data() + (r / br) * scale_cols;
    for (int64_t c = 0; c < cols; ++c)
      out[r * cols + c] = formats::fp8b128_decode_element(codes[r * cols + c], block_scales[c / bc]);
  }
  return out;
}

std::vector<float> QuantizedWeightReader::nvfp4(const std::string& name, int64_t rows, int64_t cols,
                                                bool shapes_only) {
  const TensorStore::Stored w = *store_.stored(name);
  const std::string& file = w.file->path();
  const int64_t g = q_.group_size;
  if (cols % 2 != 0)
    fail(fmt::format("{}: tensor '{}': the model's matrix is [{}, {}], an odd in-dimension, but NVFP4 packs two E2M1 "
                     "codes per byte (expected an in-dimension that is a multiple of the group size {})",
                     file, w.info->name, rows, cols, g));
  if (cols % g != 0)
    fail(fmt::format("{}: tensor '{}': the model's matrix is [{}, {}], expected an in-dimension that is a multiple of "
                     "the NVFP4 group size {}",
                     file, w.info->name, rows, cols, g));
  if (w.info->dtype != "U8")
    fail(fmt::format("{}: tensor '{}' has dtype {}, expected U8 (two E2M1 codes per byte: {} declares NVFP4)", file,
                     w.info->name, w.info->dtype, q_.source));
  if (w.info->shape != std::vector<int64_t>{rows, cols / 2})
    fail(fmt::format("{}: tensor '{}' has shape {}, expected [{}, {}] (the [{}, {}] matrix, two E2M1 codes per byte)",
                     file, w.info->name, shape_string(w.info->shape), rows, cols / 2, rows, cols));
  auto require = [&](const std::string& tensor, std::initializer_list<const char*> dtypes,
                     const std::vector<std::vector<int64_t>>& shapes, const std::string& what) {
    const auto t = store_.stored(tensor);
    if (!t)
      fail(fmt::format("{}: missing tensor '{}' (expected {} {}: {} of the NVFP4 weight '{}')",
                       store_.files_description(), tensor, dtype_list(dtypes), shape_string(shapes.front()), what,
                       w.info->name));
    if (!is_one_of(t->info->dtype, dtypes))
      fail(fmt::format("{}: tensor '{}' has dtype {}, expected {} ({} of '{}')", t->file->path(), t->info->name,
                       t->info->dtype, dtype_list(dtypes), what, w.info->name));
    if (std::find(shapes.begin(), shapes.end(), t->info->shape) == shapes.end())
      fail(fmt::format("{}: tensor '{}' has shape {}, expected {} ({} of the [{}, {}] weight '{}')", t->file->path(),
                       t->info->name, shape_string(t->info->shape), shape_string(shapes.front()), what, rows, cols,
                       w.info->name));
    store_.mark_used(tensor);
    return *t;
  };
  const std::vector<std::vector<int64_t>> scalar = {{}, {1}};
  const std::string stored = w.info->name;  // stored names, in lookups and messages
  const TensorStore::Stored s =
      require(stored + "_scale", {"F8_E4M3"}, {{rows, cols / g}}, fmt::format("the per-{} E4M3 block scales", g));
  const TensorStore::Stored s2 = require(stored + "_scale_2", {"F32"}, scalar, "the FP32 per-tensor scale");
  const float global = scalar_f32(s2);
  if (!std::isfinite(global) || std::signbit(global))
    fail(fmt::format("{}: tensor '{}' holds {}, expected a finite, non-negative scale", s2.file->path(), s2.info->name,
                     global));
  const uint8_t* scale_codes = s.file->bytes(*s.info);
  const int64_t blocks = rows * (cols / g);
  for (int64_t b = 0; b < blocks; ++b)
    if ((scale_codes[b] & 0x7Fu) == formats::kE4m3NanCode || (scale_codes[b] & 0x80u))
      fail(fmt::format("{}: tensor '{}' block [{}, {}] holds E4M3 code 0x{:02X} ({}), expected a finite, "
                       "non-negative scale",
                       s.file->path(), s.info->name, b / (cols / g), b % (cols / g), scale_codes[b],
                       formats::decode_element(ElementFormat::e4m3, scale_codes[b])));
  // The activation scale is checked and counted; the forward keeps activations in FP32.
  const std::string input_scale = stored.substr(0, stored.size() - std::string("weight").size()) + "input_scale";
  if (stored.size() > 6 && stored.compare(stored.size() - 6, 6, "weight") == 0 && store_.contains(input_scale)) {
    const TensorStore::Stored a = require(input_scale, {"F32"}, scalar, "the FP32 static activation scale");
    const float v = scalar_f32(a);
    if (!std::isfinite(v) || !(v > 0.0f))
      fail(fmt::format("{}: tensor '{}' holds {}, expected a finite, positive scale", a.file->path(), a.info->name, v));
    ++input_scales_;
  }
  store_.mark_used(name);
  dequantized_.push_back(DequantizedWeight{w.info->name, file, WeightFormat::nvfp4, rows, cols,
                                           (w.info->end - w.info->begin) + (s.info->end - s.info->begin) + 4});
  if (shapes_only) return {};
  // ModelOpt's order: the block's scale times the tensor scale, then times the element.
  std::vector<float> block_scale(static_cast<std::size_t>(blocks));
  for (int64_t b = 0; b < blocks; ++b)
    block_scale[b] = formats::decode_element(ElementFormat::e4m3, scale_codes[b]) * global;
  const uint8_t* packed = w.file->bytes(*w.info);
  std::vector<float> out(static_cast<std::size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      const uint8_t byte = packed[r * (cols / 2) + c / 2];
      const uint32_t code = c % 2 == 0 ? byte & 0x0Fu : byte >> 4;  // element 2k low nibble, 2k+1 high
      out[r * cols + c] = formats::decode_element(ElementFormat::e2m1, code) * block_scale[r * (cols / g) + c / g];
    }
  return out;
}

void QuantizedWeightReader::note_unquantized(const std::string& name, int64_t rows, int64_t cols) {
  const auto t = store_.stored(name);
  unquantized_.push_back(t ? t->info->name : name);
  unquantized_elements_ += static_cast<uint64_t>(rows * cols);
}

void QuantizedWeightReader::finish() {
  if (q_.kv_cache_quant_algo.empty()) return;
  for (const std::string& n : store_.stored_names()) {
    const bool kv = n.size() > 8 && (n.compare(n.size() - 8, 8, ".k_scale") == 0 || n.compare(n.size() - 8, 8, ".v_scale") == 0);
    if (!kv) continue;
    const auto t = *store_.stored(n);
    if (t.info->dtype != "F32" || t.info->element_count() != 1)
      fail(fmt::format("{}: tensor '{}' has dtype {} shape {}, expected F32 [] (an FP8 KV-cache scale)",
                       t.file->path(), n, t.info->dtype, shape_string(t.info->shape)));
    store_.mark_used(n);
    ++kv_scales_;
  }
}

std::string QuantizedWeightReader::describe() const {
  std::ostringstream o;
  const std::string indent(15, ' ');
  o << fmt::format("weights        quantized checkpoint: {}", to_string(*q_.format));
  if (*q_.format == WeightFormat::fp8_block)
    o << fmt::format(" (blocks {}x{}, float32 weight_scale_inv)", q_.block_rows, q_.block_cols);
  else
    o << fmt::format(" (ModelOpt: packed E2M1, E4M3 scale per {}, FP32 weight_scale_2)", q_.group_size);
  o << fmt::format(", from {}\n", q_.source);
  uint64_t stored = 0, elements = 0;
  std::vector<std::string> names;
  for (const DequantizedWeight& d : dequantized_) {
    stored += d.stored_bytes;
    elements += static_cast<uint64_t>(d.rows * d.cols);
    names.push_back(d.name);
  }
  o << fmt::format("{}{} matrices dequantized to FP32 (at load; MoE experts when the forward reads them): {} stored "
                   "(codes + scales), {} as FP32\n",
                   indent,
                   dequantized_.size(), mib(stored), mib(elements * 4));
  o << folded_list(names, indent + "  ");
  if (!unquantized_.empty()) {
    o << fmt::format("{}{} matrices stored unquantized, read as FP32 ({}):\n", indent, unquantized_.size(),
                     mib(unquantized_elements_ * 4));
    o << folded_list(unquantized_, indent + "  ");
  }
  o << fmt::format("{}excluded modules (config): {}\n", indent,
                   q_.excluded.empty() ? std::string("none") : fmt::format("{}", fmt::join(q_.excluded, ", ")));
  if (*q_.format == WeightFormat::nvfp4)
    o << fmt::format("{}activations: {} input_scale tensors recorded, not applied (the forward is FP32)\n", indent,
                     input_scales_);
  if (!q_.kv_cache_quant_algo.empty())
    o << fmt::format("{}KV cache: {} {} k_scale/v_scale tensors recorded, not applied (the KV cache is FP32)\n", indent,
                     q_.kv_cache_quant_algo, kv_scales_);
  o << fmt::format("{}weight matrices as FP32: {} in all (MoE experts are held one at a time: see memory)\n", indent,
                   mib((elements + unquantized_elements_) * 4));
  return o.str();
}

}  // namespace replayssm::model
