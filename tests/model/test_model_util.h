// Helpers of the model suites: golden model paths, temporary directories, and a minimal
// safetensors reader/writer for building corrupted or re-encoded copies of a checkpoint.
#pragma once
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "io/npy.h"
#include "model/causal_lm.h"
#include "model/json_util.h"
#include "test_util.h"

namespace replayssm::test {

inline const std::vector<std::string>& golden_models() {
  static const std::vector<std::string> names = {"mamba2_tiny", "nemotron_h_tiny", "qwen3_5_tiny",
                                                 "nemotron_h_moe_tiny", "qwen3_5_moe_tiny", "kimi_linear_tiny"};
  return names;
}
inline std::string golden_dir(const std::string& name) { return source_path("data/models/" + name); }

inline std::vector<int64_t> read_tokens(const std::string& path) {
  const io::NpyArray a = io::read_npy(path);
  std::vector<int64_t> t(a.element_count());
  std::memcpy(t.data(), a.data.data(), t.size() * 8);
  return t;
}

inline std::string slurp(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}
inline void spit(const std::filesystem::path& p, const std::string& bytes) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// A raw tensor record: dtype, shape and bytes as stored.
struct RawTensor {
  std::string dtype;
  std::vector<int64_t> shape;
  std::string bytes;
};
using RawTensors = std::map<std::string, RawTensor>;

inline RawTensors read_safetensors_raw(const std::filesystem::path& p) {
  const std::string b = slurp(p);
  uint64_t n = 0;
  std::memcpy(&n, b.data(), 8);
  const auto h = nlohmann::json::parse(b.substr(8, n));
  RawTensors out;
  for (auto it = h.begin(); it != h.end(); ++it) {
    if (it.key() == "__metadata__") continue;
    const uint64_t s = it.value()["data_offsets"][0], e = it.value()["data_offsets"][1];
    out[it.key()] =
        RawTensor{it.value()["dtype"], it.value()["shape"].get<std::vector<int64_t>>(), b.substr(8 + n + s, e - s)};
  }
  return out;
}

// Header JSON and data region of a valid file holding `t` (alphabetical order, 8-byte padded header).
inline nlohmann::json safetensors_header(const RawTensors& t) {
  nlohmann::json h = nlohmann::json::object();
  uint64_t off = 0;
  for (const auto& [name, r] : t) {
    h[name] = {{"dtype", r.dtype}, {"shape", r.shape}, {"data_offsets", {off, off + r.bytes.size()}}};
    off += r.bytes.size();
  }
  h["__metadata__"] = {{"format", "pt"}};
  return h;
}
inline std::string safetensors_bytes(const nlohmann::json& header, const RawTensors& t) {
  std::string hs = header.dump();
  hs.append((8 - hs.size() % 8) % 8, ' ');
  const uint64_t n = hs.size();
  std::string out(8, '\0');
  std::memcpy(out.data(), &n, 8);
  out += hs;
  for (const auto& [name, r] : t) out += r.bytes;
  return out;
}
inline void write_safetensors_raw(const std::filesystem::path& p, const RawTensors& t) {
  spit(p, safetensors_bytes(safetensors_header(t), t));
}

// Copies a golden model's config.json and model.safetensors into dir.
inline void copy_model(const std::string& name, const std::filesystem::path& dir) {
  std::filesystem::create_directories(dir);
  for (const char* f : {"config.json", "model.safetensors"})
    std::filesystem::copy_file(std::filesystem::path(golden_dir(name)) / f, dir / f,
                               std::filesystem::copy_options::overwrite_existing);
}

// Rewrites dir/config.json through `edit`.
inline void edit_config(const std::filesystem::path& dir, const std::function<void(nlohmann::json&)>& edit) {
  nlohmann::json j = model::read_json_file((dir / "config.json").string());
  edit(j);
  spit(dir / "config.json", j.dump(2));
}

// The message CausalLM::load throws for the checkpoint in dir; "(no error)" when it loads.
inline std::string load_error(const std::filesystem::path& dir) {
  return error_of([&] { (void)model::CausalLM::load(dir.string()); });
}

}  // namespace replayssm::test
