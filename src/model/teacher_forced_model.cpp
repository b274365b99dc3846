// The KL sweep's view of a CausalLM (model::TeacherForcedModel). final_hidden runs every SSM layer under one policy;
// log_probs applies the LM head and log-softmax to any slice of hidden rows, so the sweep streams positions chunk by
// chunk.
#include "model/teacher_forced_model.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <stdexcept>

#include <fmt/format.h>

#include "model/causal_lm.h"

namespace replayssm::model {
namespace {

// FNV-1a-style 64-bit hash over 8-byte little-endian words (the tail zero-padded), a fast content
// fingerprint (not cryptographic) of config.json and the weight files.
class WordHash {
 public:
  void add(const char* p, std::size_t n) {
    std::size_t i = 0;
    for (; i + 8 <= n; i += 8) {
      uint64_t w;
      std::memcpy(&w, p + i, 8);
      mix(w);
    }
    if (i < n) {
      uint64_t w = 0;
      std::memcpy(&w, p + i, n - i);
      mix(w);
    }
    mix(static_cast<uint64_t>(n));
  }
  uint64_t value() const { return h_; }

 private:
  void mix(uint64_t w) {
    h_ ^= w;
    h_ *= 0x100000001b3ULL;
    h_ ^= h_ >> 29;
  }
  uint64_t h_ = 0xcbf29ce484222325ULL;
};

void hash_file(WordHash& h, const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  if (!f) throw std::runtime_error(fmt::format("{}: cannot open for hashing", p.string()));
  const std::string name = p.filename().string();
  h.add(name.data(), name.size());
  std::vector<char> buf(std::size_t{1} << 22);
  while (f) {
    f.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    const std::size_t got = static_cast<std::size_t>(f.gcount());
    if (got) h.add(buf.data(), got);
  }
}

class CausalLMTeacherForced final : public TeacherForcedModel {
 public:
  CausalLMTeacherForced(CausalLM lm, int threads) : lm_(std::move(lm)), threads_(threads) {}
  int vocab_size() const override { return lm_.vocab_size(); }
  int hidden_size() const override { return lm_.config().hidden_size; }
  std::string description() const override {
    const ModelConfig& c = lm_.config();
    std::string ssm;
    if (c.arch == Architecture::qwen3_5)
      ssm = fmt::format("GDN {}k/{}v heads dk {} dv {}", c.gdn.num_k_heads, c.gdn.num_v_heads, c.gdn.dk, c.gdn.dv);
    else if (c.arch == Architecture::kimi_linear)
      ssm = fmt::format("KDA {} heads dk = dv = {}", c.kda.num_heads, c.kda.head_dim);
    else
      ssm = fmt::format("Mamba-2 {}k/{}v heads dk {} dv {}", c.mamba.n_groups, c.mamba.num_heads, c.mamba.state_size,
                        c.mamba.head_dim);
    return fmt::format("{} ({}), layers {}, {}, {} parameters", c.model_type, to_string(c.arch), c.pattern(), ssm,
                       lm_.parameter_count());
  }
  // Hash of config.json and every *.safetensors / index file of the directory (sorted by name),
  // computed on first use.
  std::string content_hash() const override {
    if (hash_.empty()) {
      namespace fs = std::filesystem;
      std::vector<fs::path> files{fs::path(lm_.directory()) / "config.json"};
      for (const auto& e : fs::directory_iterator(lm_.directory())) {
        const std::string n = e.path().filename().string();
        if (e.is_regular_file() && (n.ends_with(".safetensors") || n == "model.safetensors.index.json"))
          files.push_back(e.path());
      }
      std::sort(files.begin() + 1, files.end());
      WordHash h;
      for (const auto& f : files) hash_file(h, f);
      hash_ = fmt::format("{:016x}", h.value());
    }
    return hash_;
  }
  RowMatrixXf final_hidden(std::span<const int32_t> tokens, const ssm::PrecisionPolicy& policy) override {
    const std::vector<int64_t> ids(tokens.begin(), tokens.end());
    return lm_.final_hidden(ids, PolicyAssignment(policy), threads_);
  }
  RowMatrixXf log_probs(const Eigen::Ref<const RowMatrixXf>& hidden_rows) override {
    Mat out;
    lm_.lm_head(hidden_rows, true, threads_, out);
    return out;
  }
  const CausalLM* causal_lm() const override { return &lm_; }

 private:
  CausalLM lm_;
  int threads_;  // 0: all hardware threads
  mutable std::string hash_;
};

}  // namespace

std::unique_ptr<TeacherForcedModel> load_teacher_forced_model(const std::string& dir, int threads) {
  if (threads < 0) throw std::invalid_argument(fmt::format("{}: forward threads {} must be >= 0", dir, threads));
  return std::make_unique<CausalLMTeacherForced>(CausalLM::load(dir), threads);
}

}  // namespace replayssm::model
