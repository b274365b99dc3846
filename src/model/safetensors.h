// Safetensors checkpoints (Hugging Face): one `model.safetensors` or shards listed by
// `model.safetensors.index.json`. Files are memory-mapped; tensors are converted to float32 on
// request (F32, BF16 and F16 are accepted), so a checkpoint is read once and never held twice.
//
// File layout: u64 little-endian header length n, n bytes of JSON
//   {"name": {"dtype": "BF16", "shape": [..], "data_offsets": [begin, end]}, ..., "__metadata__": {..}}
// then the data region; offsets are relative to the start of the data region. The header is
// validated completely on open (length vs file size, JSON, every dtype/shape/offset pair, byte
// size = element count x dtype size, no overlaps, everything inside the file): a truncated file
// or a header that lies about offsets is an error naming the file, the tensor and what was
// expected, before any tensor is read.
#pragma once
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace replayssm::model {

struct TensorInfo {
  std::string name;
  std::string dtype;  // safetensors spelling: F32, BF16, F16, I64, ...
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;  // byte offsets inside the data region
  int64_t element_count() const;
};

std::string shape_string(const std::vector<int64_t>& shape);  // "[2, 3]"

// One memory-mapped .safetensors file.
class SafetensorsFile {
 public:
  // Throws std::runtime_error naming the file and the problem.
  explicit SafetensorsFile(std::string path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  const std::map<std::string, TensorInfo>& tensors() const { return tensors_; }
  const TensorInfo* find(const std::string& name) const;
  // Float32 copy of a tensor (F32, BF16 or F16; other dtypes are an error naming the tensor).
  std::vector<float> read_float32(const TensorInfo& t) const;
  // Elements [first, first + count) of the tensor (storage order) converted to float32 into `out`;
  // the range must lie inside the tensor. Const and thread-safe: reads the mapping only.
  void read_float32(const TensorInfo& t, uint64_t first, uint64_t count, float* out) const;
  // NaN and Inf elements of a float tensor (F32, BF16, F16), counted on the stored bits in place.
  int64_t count_non_finite(const TensorInfo& t) const;
  // The tensor's bytes as stored (t.end - t.begin of them).
  const uint8_t* bytes(const TensorInfo& t) const { return map_ + data_start_ + t.begin; }
  // Drops the pages read so far from this process's resident set (they stay in the page cache
  // and are read again when touched): after loading, only what the forward touches is resident.
  void release_pages() const;
  // The same for the pages holding one tensor's bytes (and the partial pages at its ends).
  void release_pages(const TensorInfo& t) const;

 private:
  std::string path_;
  const uint8_t* map_ = nullptr;
  std::size_t map_size_ = 0;
  std::size_t data_start_ = 0;
  std::map<std::string, TensorInfo> tensors_;
};

// A float32 tensor read from a checkpoint.
struct Tensor {
  std::vector<int64_t> shape;
  std::vector<float> data;
};

// A float tensor holding NaN or Inf values: loaded as stored, but reported.
struct NonFiniteTensor {
  std::string name, file;
  int64_t count = 0, elements = 0;
};

// All tensors of a model directory, from one file or from the shards of an index.
// Each `take` marks its tensor used; `check_all_used` then reports tensors the model did not use.
class TensorStore {
 public:
  // Opens DIR/model.safetensors.index.json (and every shard it names) or DIR/model.safetensors.
  explicit TensorStore(const std::string& model_dir);
  // Renames tensors: a tensor whose name starts with `from` is also found under `to` + rest
  // (e.g. "backbone." -> "model."). Applied in order, first match wins.
  void add_prefix_alias(const std::string& from, const std::string& to);
  // Tensors whose (aliased) name starts with one of these prefixes are skipped by check_all_used.
  void ignore_prefix(const std::string& prefix);

  bool contains(const std::string& name) const;
  // The tensor `name`, converted to float32; `expected_shape` is checked. A missing tensor or a
  // shape mismatch throws std::runtime_error naming the file(s), the tensor and the expectation.
  Tensor take(const std::string& name, const std::vector<int64_t>& expected_shape);
  // The checks of `take` (presence, shape, dtype) and the "used" mark, without converting the
  // data; the stored values are scanned for NaN and Inf (see non_finite()).
  void check(const std::string& name, const std::vector<int64_t>& expected_shape);
  // Whether two tensors hold the same float32 values, bit for bit (both must exist).
  bool same_values(const std::string& a, const std::string& b) const;
  // Tensors checked so far that hold NaN or Inf values, in the order checked.
  const std::vector<NonFiniteTensor>& non_finite() const { return non_finite_; }
  // Shape without reading the data (for validation and `info`); throws when missing.
  std::vector<int64_t> shape_of(const std::string& name) const;
  // The stored tensor (file and header entry) without any dtype check, or nullptr when missing:
  // for readers of quantized dtypes (model/quantized_weights.h), which then call mark_used.
  struct Stored {
    const SafetensorsFile* file;
    const TensorInfo* info;
  };
  std::optional<Stored> stored(const std::string& name) const;
  // Thread-safe (lazily read weights are dequantized by several threads at once).
  void mark_used(const std::string& name);
  // Names of all stored tensors, as stored.
  std::vector<std::string> stored_names() const;
  // Throws std::runtime_error listing unused tensors (up to a few), each with its file.
  void check_all_used(const std::string& what) const;

  const std::string& directory() const { return dir_; }
  // SafetensorsFile::release_pages of every file.
  void release_pages() const;
  // Files opened, for messages.
  std::string files_description() const;
  std::size_t tensor_count() const { return entries_.size(); }

 private:
  struct Entry {
    const SafetensorsFile* file;
    const TensorInfo* info;
  };
  const Entry* lookup(const std::string& name) const;
  std::string canonical(const std::string& stored_name) const;

  std::string dir_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, Entry> entries_;  // keyed by canonical (aliased) name
  std::vector<std::pair<std::string, std::string>> aliases_;
  std::vector<std::string> ignored_;
  std::mutex used_mutex_;  // guards used_ and non_finite_
  std::set<std::string> used_;
  std::vector<NonFiniteTensor> non_finite_;
};

}  // namespace replayssm::model
