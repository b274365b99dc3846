// A Hugging Face causal language model (Mamba2, Nemotron-H, Qwen3.5 text) loaded from a
// checkpoint directory and run teacher-forced on the CPU, with the SSM state of every SSM layer
// stored and decoded under a ssm::PrecisionPolicy.
//
// Teacher forcing: the N input tokens are fed in order and every position t yields the model's
// next-token distribution after tokens[0..t]. Processing is layer by layer over all N positions
// (the sequence emulator replays a whole head group's sequence at once), so memory is
// O(N (hidden + widest layer)), never O(N^2) (attention is blockwise) and never O(N vocab): the
// LM head runs over chunks of positions and hands each chunk to a callback. Work is split into
// fixed blocks (positions, head groups, vocabulary slices), so results are bitwise independent of
// the thread count. The KL sweep's contract (model::TeacherForcedModel) is implemented on top of
// final_hidden() + lm_head() in model/teacher_forced_model.cpp.
//
//   CausalLM lm = CausalLM::load("data/models/qwen3_5_tiny");
//   ForwardOptions opt;  opt.chunk_positions = 256;
//   lm.forward(tokens, {ssm::PrecisionPolicy::parse("conv:fp32"), ssm::PrecisionPolicy::parse("split:nvfp4/fp32@16")},
//              opt, [&](const LogitsChunk& c) {
//                // c.rows[0], c.rows[1]: c.count x c.vocab log-probabilities of positions
//                // [c.begin, c.begin + c.count) under each policy: accumulate KL here.
//              });
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "model/layers.h"
#include "model/model_config.h"
#include "model/quantized_weights.h"
#include "model/safetensors.h"
#include "ssm/precision_policy.h"

namespace replayssm::model {

// The precision policy of every SSM layer: `all`, except layers listed in `per_layer`
// (keys are block indices, as in `replayssm info`).
struct PolicyAssignment {
  ssm::PrecisionPolicy all;
  std::map<int, ssm::PrecisionPolicy> per_layer;
  PolicyAssignment() = default;
  PolicyAssignment(ssm::PrecisionPolicy p) : all(p) {}  // NOLINT: implicit on purpose
  const ssm::PrecisionPolicy& for_layer(int layer) const;
  std::string to_string() const;
};

struct ForwardOptions {
  int threads = 0;            // 0: all hardware threads
  int chunk_positions = 256;  // positions per callback
  bool log_softmax = true;    // true: log-probabilities; false: raw logits
  // Optional progress report after each layer of each variant (long sequences take a while).
  std::function<void(int variant, int layer, int n_layers, double seconds)> on_layer_done;
};

// One chunk of positions: rows[v] points to count x vocab floats (row-major) for variant v,
// valid only during the callback.
struct LogitsChunk {
  std::size_t begin = 0, count = 0;
  int vocab = 0;
  std::vector<const float*> rows;
};
using ChunkCallback = std::function<void(const LogitsChunk&)>;

struct LayerInfo {
  int index = 0;
  LayerKind kind = LayerKind::mlp;
  bool has_mlp = false;  // Qwen3.5: the decoder layer also has an MLP
};

class CausalLM {
 public:
  // Reads config.json and the safetensors weights (converted to float32). Throws
  // std::runtime_error naming file, tensor and expectation on any inconsistency, including
  // tensors the model does not use.
  static CausalLM load(const std::string& model_dir);
  // Tensors holding NaN or Inf are loaded as stored, with a warning on stderr naming each one
  // and its count (see non_finite_weights()).
  // The same validation without converting weight data: for `replayssm info` on large
  // checkpoints (each tensor is only scanned in place for NaN and Inf). The result has shapes, a
  // parameter count and the non-finite report, but cannot run.
  static CausalLM inspect(const std::string& model_dir);

  CausalLM(CausalLM&&) noexcept;
  CausalLM& operator=(CausalLM&&) noexcept;
  ~CausalLM();

  const ModelConfig& config() const { return config_; }
  const std::string& directory() const { return dir_; }
  std::size_t parameter_count() const { return parameters_; }
  int vocab_size() const { return config_.vocab_size; }
  std::vector<LayerInfo> layers() const;
  // Tensors of the checkpoint that hold NaN or Inf values (empty for a clean checkpoint).
  const std::vector<NonFiniteTensor>& non_finite_weights() const { return non_finite_; }
  // Weight matrices that were stored quantized (FP8 block-scaled, NVFP4) and dequantized to FP32.
  const std::vector<DequantizedWeight>& dequantized_weights() const { return dequantized_; }
  // Human-readable summary (architecture, pattern, SSM head shapes, parameter count, the
  // quantized weights and what they were dequantized to, the tensors holding NaN or Inf, if any,
  // and forward_memory() at each of `lengths` positions with `threads` worker threads, 0: all
  // hardware threads).
  std::string describe(const std::vector<int64_t>& lengths = {4096, 32768, 131072}, int threads = 0) const;
  // Memory the forward of one policy over `positions` tokens with `threads` (resolved, >= 1)
  // worker threads needs, in bytes (the formula is printed by describe()): the float32 weights
  // (4 B x parameters, each tensor held once) but the experts', the expert tensors as stored in
  // the mapped checkpoint files, the experts converted to float32 at once (one per worker thread
  // running an expert, with its block products and any dequantization scratch), and the largest
  // activation buffers alive at once. Computed from the config and the checkpoint's headers
  // alone: valid after inspect().
  struct MemoryEstimate {
    int64_t weight_bytes = 0;          // float32 tensors held: every one but the experts'
    int64_t mapped_expert_bytes = 0;   // expert tensors as stored, read in place from the mapping
    int64_t expert_working_bytes = 0;  // experts as float32 at once: workers x per-worker floats x 4
    int64_t activation_bytes = 0;
    int64_t expert_workers = 0, expert_worker_floats = 0;
    int64_t mixer_width = 0, position_block_width = 0;  // floats per position (see describe())
    int64_t total() const { return weight_bytes + mapped_expert_bytes + expert_working_bytes + activation_bytes; }
  };
  MemoryEstimate forward_memory(int64_t positions, int threads = 1) const;

  // Teacher-forced forward of `tokens` under each variant (one pass per variant through the
  // layers, then one shared LM-head pass), streaming logits or log-probs in position chunks.
  // Token ids outside [0, vocab) throw std::invalid_argument naming the position.
  void forward(const std::vector<int64_t>& tokens, const std::vector<PolicyAssignment>& variants,
               const ForwardOptions& options, const ChunkCallback& callback) const;
  // Final-norm hidden states (N x hidden) of one variant: what the LM head reads. `observe`, when
  // given, sees every SSM head group's recurrence inputs (layers.h SequenceObserver).
  Mat final_hidden(const std::vector<int64_t>& tokens, const PolicyAssignment& policy, int threads = 0,
                   const std::function<void(int layer, int n_layers, double seconds)>& on_layer_done = {},
                   const SequenceObserver* observe = nullptr) const;
  // LM head (and log-softmax) over any rows of final hidden states: out is rows x vocab.
  void lm_head(const Eigen::Ref<const Mat>& hidden_rows, bool log_softmax, int threads, Mat& out) const;
  // Convenience for short sequences: the whole N x vocab matrix of log-probs (or logits).
  Mat log_probs(const std::vector<int64_t>& tokens, const PolicyAssignment& policy,
                const ForwardOptions& options = {}) const;

  // One decoder layer as loaded: h += mixer(norm(h)), then (Qwen3.5, Kimi Linear) h += mlp(mlp_norm(h)).
  struct Layer {
    LayerKind kind;
    Vec norm;  // pre-mixer norm
    std::unique_ptr<Block> mixer;
    Vec mlp_norm;  // Qwen3.5: post_attention_layernorm
    std::unique_ptr<Block> mlp;
  };
  // Read-only views of the loaded weights, for the GPU twin (cuda/model) that uploads them. The
  // norms follow config().norm_eps and config().norm_plus_one; lm_head_weight() is the embedding
  // when the word embeddings are tied.
  const std::vector<Layer>& layer_blocks() const { return layers_; }
  const Mat& embedding() const { return embed_; }
  const Mat& lm_head_weight() const { return config_.tie_word_embeddings ? embed_ : lm_head_; }
  const Vec& final_norm() const { return final_norm_; }
  bool runnable() const { return runnable_; }

 private:
  CausalLM() = default;
  static CausalLM build(const std::string& model_dir, bool shapes_only);
  std::string memory_description(const std::vector<int64_t>& lengths, int threads) const;

  ModelConfig config_;
  std::string dir_;
  // The mapped checkpoint: expert matrices are read from it during the forward (declared before
  // layers_, so it outlives them).
  std::shared_ptr<TensorStore> checkpoint_;
  bool runnable_ = false;
  std::size_t parameters_ = 0;
  std::size_t stored_parameters_ = 0;  // expert matrices left in the checkpoint
  uint64_t stored_bytes_ = 0;          // their bytes as stored
  int64_t stored_scratch_floats_ = 0;  // largest dequantization scratch of one of them
  Mat embed_;    // vocab x hidden
  Mat lm_head_;  // vocab x hidden (empty when tied: embed_ is used)
  Vec final_norm_;
  std::vector<Layer> layers_;
  std::vector<NonFiniteTensor> non_finite_;
  std::vector<DequantizedWeight> dequantized_;
  std::string quantization_summary_;  // `info` lines of a quantized checkpoint; empty otherwise
};

// Row-wise log-softmax in place (row max in float, the normaliser in double): what lm_head applies,
// and what the GPU path of `replayssm logits` applies to logits made on the GPU.
void log_softmax_rows(Mat& rows, int threads);

}  // namespace replayssm::model
