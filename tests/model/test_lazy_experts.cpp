// Expert weights read lazily from the memory-mapped checkpoint (model/moe.h, model/layers.h
// StoredMatrix): a fetch gives the values the eager read gives, bit for bit; every expert tensor
// is still checked when the model loads; and the memory estimate of `info` adds up the model's
// actual tensors (non-expert float32, expert bytes as stored, one expert per worker thread).
#include <doctest/doctest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <random>
#include <tuple>

#include <fmt/format.h>

#include "model/causal_lm.h"
#include "model/layers.h"
#include "model/moe.h"
#include "model/safetensors.h"
#include "test_model_util.h"

using namespace replayssm;
using namespace replayssm::model;
using replayssm::test::contains;
using replayssm::test::copy_model;
using replayssm::test::golden_dir;
using replayssm::test::load_error;
using replayssm::test::RawTensor;
using replayssm::test::RawTensors;
using replayssm::test::read_safetensors_raw;
using replayssm::test::TempDir;
using replayssm::test::write_safetensors_raw;
namespace fs = std::filesystem;

namespace {

// Random float32 values (never all zero), stored as dtype F32, BF16 (upper half) or F16.
RawTensor random_tensor(const std::string& dtype, const std::vector<int64_t>& shape, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::size_t n = 1;
  for (const int64_t d : shape) n *= static_cast<std::size_t>(d);
  RawTensor t{dtype, shape, {}};
  for (std::size_t i = 0; i < n; ++i) {
    const float v = normal(rng);
    uint32_t bits;
    std::memcpy(&bits, &v, 4);
    if (dtype == "F32") {
      t.bytes.append(reinterpret_cast<const char*>(&bits), 4);
    } else {
      // BF16: the upper half; F16: a random code that is finite (exponent bits not all set)
      const uint16_t h = dtype == "BF16" ? static_cast<uint16_t>(bits >> 16)
                                         : static_cast<uint16_t>((bits >> 16 & 0x83ffu) | (i % 30 + 1) << 10);
      t.bytes.append(reinterpret_cast<const char*>(&h), 2);
    }
  }
  return t;
}

bool same_bits(const std::vector<float>& a, const float* b, std::size_t n) {
  return a.size() == n && std::memcmp(a.data(), b, n * sizeof(float)) == 0;
}

}  // namespace

TEST_CASE("a stored matrix fetches the values the eager read gives, bit for bit (F32, BF16, F16, fused slices)") {
  TempDir tmp;
  std::mt19937 rng(20261212);
  write_safetensors_raw(tmp.path() / "model.safetensors", {{"fused", random_tensor("F32", {3, 6, 5}, rng)},
                                                           {"b", random_tensor("BF16", {4, 5}, rng)},
                                                           {"h", random_tensor("F16", {4, 5}, rng)}});
  TensorStore store(tmp.str());
  WeightLoader w(store, false);
  for (const char* name : {"b", "h"}) {
    CAPTURE(name);
    const StoredMatrix m = w.stored_matrix(name, 4, 5);
    std::vector<float> got;
    m.fetch(got);
    const Tensor want = store.take(name, {4, 5});
    CHECK(same_bits(got, want.data.data(), want.data.size()));
    CHECK(std::any_of(got.begin(), got.end(), [](float v) { return v != 0.0f; }));
    CHECK(m.stored_bytes() == 4 * 5 * 2);
  }
  const std::vector<StoredMatrix> experts = w.stored_stack("fused", 3, 6, 5);
  const Tensor all = store.take("fused", {3, 6, 5});
  REQUIRE(experts.size() == 3);
  for (int e = 0; e < 3; ++e) {
    CAPTURE(e);
    std::vector<float> got;
    experts[static_cast<std::size_t>(e)].fetch(got);
    CHECK(same_bits(got, all.data.data() + e * 30, 30));
    experts[static_cast<std::size_t>(e)].row_slice(2, 4).fetch(got);  // a gate_up tensor's second half
    CHECK(same_bits(got, all.data.data() + e * 30 + 2 * 5, 20));
  }
  CHECK(w.stored_parameter_count() == 3 * 30 + 2 * 20);
  CHECK(w.parameter_count() == w.stored_parameter_count());
  CHECK(w.stored_bytes() == 3 * 30 * 4 + 2 * 20 * 2);
  store.check_all_used("lazy test");
}

TEST_CASE("a bad expert tensor fails at load, before any forward, naming file, tensor and expectation") {
  for (const bool inspect : {false, true}) {
    CAPTURE(inspect);
    TempDir tmp;
    const fs::path dir = tmp.path() / "m";
    copy_model("qwen3_5_moe_tiny", dir);
    const fs::path file = dir / "model.safetensors";
    RawTensors raw = read_safetensors_raw(file);
    const auto error = [&] {
      return inspect ? test::error_of([&] { (void)CausalLM::inspect(dir.string()); }) : load_error(dir);
    };
    // The last expert of the last layer: found only when every expert tensor is checked.
    const std::string name = "model.layers.2.mlp.experts.7.down_proj.weight";
    REQUIRE(raw.count(name));
    raw[name].dtype = "I32";  // same byte size as F32
    write_safetensors_raw(file, raw);
    std::string e = error();
    CHECK(contains(e, file.string()));
    CHECK(contains(e, "tensor '" + name + "' has dtype I32, expected F32, BF16 or F16"));
    raw[name].dtype = "F32";
    raw[name].shape = {8, 32};
    write_safetensors_raw(file, raw);
    e = error();
    CHECK(contains(e, file.string()));
    CHECK(contains(e, "tensor '" + name + "' has shape [8, 32], expected [32, 8]"));
    raw.erase(name);
    write_safetensors_raw(file, raw);
    CHECK(contains(error(), "missing tensor '" + name + "' (expected shape [32, 8])"));
  }
}

TEST_CASE("forward_memory: non-expert float32 + expert bytes as stored + one expert per worker, from the tensors") {
  for (const std::string name : {"nemotron_h_moe_tiny", "qwen3_5_moe_tiny"}) {
    CAPTURE(name);
    const CausalLM lm = CausalLM::inspect(golden_dir(name));
    const ModelConfig& c = lm.config();
    // Sizes from the checkpoint itself.
    int64_t expert_bytes = 0, other_elements = 0;
    for (const auto& [n, t] : read_safetensors_raw(fs::path(golden_dir(name)) / "model.safetensors")) {
      if (n.find(".experts.") != std::string::npos) {
        expert_bytes += static_cast<int64_t>(t.bytes.size());
        continue;
      }
      if (n == "lm_head.weight" && c.tie_word_embeddings) continue;  // a tied copy is not held
      int64_t e = 1;
      for (const int64_t d : t.shape) e *= d;
      other_elements += e;
    }
    REQUIRE(expert_bytes > 0);
    const MoeShape& s = c.moe;
    const int64_t in = s.latent_size ? s.latent_size : c.hidden_size, inter = s.expert_intermediate;
    const int64_t one_expert = (s.activation == ExpertActivation::swiglu ? 3 : 2) * inter * in;
    for (const auto& [n, threads, workers] :
         std::vector<std::tuple<int64_t, int, int64_t>>{{1000, 3, 3}, {1000, 100, 8}, {1, 100, 3}, {50, 1, 1}}) {
      CAPTURE(n);
      CAPTURE(threads);
      const CausalLM::MemoryEstimate m = lm.forward_memory(n, threads);
      CHECK(m.weight_bytes == 4 * other_elements);
      CHECK(m.mapped_expert_bytes == expert_bytes);
      CHECK(m.expert_workers == workers);
      CHECK(m.expert_worker_floats == one_expert + std::min<int64_t>(n, 128) * (2 * in + 2 * inter));
      CHECK(m.expert_working_bytes == 4 * workers * m.expert_worker_floats);
      CHECK(m.total() == m.weight_bytes + m.mapped_expert_bytes + m.expert_working_bytes + m.activation_bytes);
      CHECK(4 * other_elements + expert_bytes / 4 * 4 ==
            4 * static_cast<int64_t>(lm.parameter_count()));  // float32 goldens: every parameter counted once
    }
    const std::string d = lm.describe({1234}, 2);
    const CausalLM::MemoryEstimate m = lm.forward_memory(1234, 2);
    CHECK(contains(d, fmt::format("all but the experts') + experts {:.2f} MiB", expert_bytes / 1048576.0)));
    CHECK(contains(d, fmt::format("N =   1234: {:.2f} MiB", static_cast<double>(m.total()) / 1048576.0)));
    CHECK(!contains(d, "N =   4096"));
  }
  // A model without experts: every weight float32, nothing mapped, no experts' working set.
  const CausalLM dense = CausalLM::inspect(golden_dir("qwen3_5_tiny"));
  const CausalLM::MemoryEstimate m = dense.forward_memory(1000, 4);
  CHECK(m.weight_bytes == 4 * static_cast<int64_t>(dense.parameter_count()));
  CHECK(m.mapped_expert_bytes == 0);
  CHECK(m.expert_working_bytes == 0);
  CHECK(contains(dense.describe(), fmt::format("memory         weights {:.2f} MiB (4 B x {} parameters, float32, each "
                                               "tensor held once)\n",
                                               m.weight_bytes / 1048576.0, dense.parameter_count())));
  CHECK_THROWS_WITH_AS(dense.forward_memory(-1, 1), doctest::Contains("-1 positions"), std::invalid_argument);
}
