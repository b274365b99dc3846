#include "model/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <limits>
#include <stdexcept>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "formats/element_formats.h"
#include "model/json_util.h"

namespace replayssm::model {
namespace {

// Bytes per element of every dtype the safetensors format defines (0: unknown).
std::size_t dtype_size(const std::string& d) {
  static const std::map<std::string, std::size_t> sizes = {
      {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E4M3", 1}, {"F8_E5M2", 1}, {"I16", 2}, {"U16", 2}, {"F16", 2},
      {"BF16", 2}, {"I32", 4}, {"U32", 4}, {"F32", 4},     {"I64", 8},     {"U64", 8}, {"F64", 8}};
  auto it = sizes.find(d);
  return it == sizes.end() ? 0 : it->second;
}

// Largest header the reference implementation accepts (100 MB).
constexpr uint64_t kMaxHeader = 100'000'000;

[[noreturn]] void fail(const std::string& path, const std::string& what) {
  throw std::runtime_error(fmt::format("{}: {}", path, what));
}

}  // namespace

int64_t TensorInfo::element_count() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string shape_string(const std::vector<int64_t>& shape) { return fmt::format("[{}]", fmt::join(shape, ", ")); }

SafetensorsFile::SafetensorsFile(std::string path) : path_(std::move(path)) {
  // O_NONBLOCK: opening a FIFO must not wait for a writer (it is refused below); no effect on files.
  const int fd = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    const int e = errno;
    std::error_code ec;
    if (e == ENOENT && std::filesystem::is_symlink(std::filesystem::symlink_status(path_, ec)))
      fail(path_, fmt::format("is a broken symbolic link to '{}', expected the safetensors file",
                              std::filesystem::read_symlink(path_, ec).string()));
    fail(path_, fmt::format("cannot open safetensors file: {}", std::strerror(e)));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int e = errno;
    ::close(fd);
    fail(path_, fmt::format("cannot stat: {}", std::strerror(e)));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    fail(path_, S_ISDIR(st.st_mode) ? "is a directory, expected the safetensors file"
                                    : "is not a regular file, expected the safetensors file");
  }
  map_size_ = static_cast<std::size_t>(st.st_size);
  if (map_size_ < 8) {
    ::close(fd);
    fail(path_,
         fmt::format("truncated safetensors file: {} bytes, expected at least 8 (the header length)", map_size_));
  }
  void* m = ::mmap(nullptr, map_size_, PROT_READ, MAP_PRIVATE, fd, 0);
  const int e = errno;
  ::close(fd);
  if (m == MAP_FAILED) fail(path_, fmt::format("cannot mmap {} bytes: {}", map_size_, std::strerror(e)));
  map_ = static_cast<const uint8_t*>(m);

  try {
    uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = (n << 8) | map_[i];
    if (n > kMaxHeader)
      fail(path_,
           fmt::format("header length {} is implausible (limit {} bytes): not a safetensors file?", n, kMaxHeader));
    if (8 + n > map_size_)
      fail(path_, fmt::format("truncated safetensors file: header length says {} bytes of JSON after the 8-byte "
                              "prefix, but the file has only {} bytes (expected at least {})",
                              n, map_size_, 8 + n));
    data_start_ = 8 + static_cast<std::size_t>(n);
    const std::size_t data_size = map_size_ - data_start_;
    nlohmann::json header;
    try {
      header =
          nlohmann::json::parse(reinterpret_cast<const char*>(map_ + 8), reinterpret_cast<const char*>(map_ + 8 + n));
    } catch (const nlohmann::json::exception& ex) {
      fail(path_, fmt::format("safetensors header is not valid JSON ({} bytes): {}", n, printable(ex.what())));
    }
    if (!header.is_object()) fail(path_, "safetensors header is not a JSON object");

    for (auto it = header.begin(); it != header.end(); ++it) {
      if (it.key() == "__metadata__") continue;
      const std::string& name = it.key();
      const auto& v = it.value();
      auto bad = [&](const std::string& what) { fail(path_, fmt::format("tensor '{}': {}", name, what)); };
      if (!v.is_object()) bad("header entry is not an object");
      if (!v.contains("dtype") || !v["dtype"].is_string()) bad("missing or non-string \"dtype\"");
      if (!v.contains("shape") || !v["shape"].is_array()) bad("missing or non-array \"shape\"");
      if (!v.contains("data_offsets") || !v["data_offsets"].is_array() || v["data_offsets"].size() != 2)
        bad("missing \"data_offsets\" (expected [begin, end])");
      TensorInfo t;
      t.name = name;
      t.dtype = v["dtype"].get<std::string>();
      const std::size_t esize = dtype_size(t.dtype);
      if (esize == 0) bad(fmt::format("unknown dtype '{}'", t.dtype));
      uint64_t count = 1;
      for (const auto& d : v["shape"]) {
        if (!d.is_number_integer() || d.get<int64_t>() < 0)
          bad(fmt::format("shape {} has a non-integer or negative entry", v["shape"].dump()));
        const auto dim = d.get<uint64_t>();
        if (dim != 0 && count > std::numeric_limits<uint64_t>::max() / 8 / dim) bad("shape overflows");
        count *= dim;
        t.shape.push_back(static_cast<int64_t>(dim));
      }
      for (const auto& o : v["data_offsets"])
        if (!o.is_number_integer() || o.get<int64_t>() < 0)
          bad(fmt::format("data_offsets {} are not non-negative integers", v["data_offsets"].dump()));
      t.begin = v["data_offsets"][0].get<uint64_t>();
      t.end = v["data_offsets"][1].get<uint64_t>();
      if (t.end < t.begin) bad(fmt::format("data_offsets [{}, {}] end before they begin", t.begin, t.end));
      const uint64_t bytes = count * esize;
      if (t.end - t.begin != bytes)
        bad(
            fmt::format("data_offsets [{}, {}] span {} bytes, but dtype {} shape {} needs {} bytes "
                        "(header lies about offsets)",
                        t.begin, t.end, t.end - t.begin, t.dtype, shape_string(t.shape), bytes));
      if (t.end > data_size)
        bad(
            fmt::format("data_offsets [{}, {}] reach past the end of the data region ({} bytes; file has {} bytes, "
                        "expected at least {}): truncated file or header lying about offsets",
                        t.begin, t.end, data_size, map_size_, data_start_ + t.end));
      tensors_.emplace(name, std::move(t));
    }
    // Overlapping byte ranges mean the header lies about offsets.
    std::vector<const TensorInfo*> by_offset;
    for (const auto& [_, t] : tensors_)
      if (t.end > t.begin) by_offset.push_back(&t);
    std::sort(by_offset.begin(), by_offset.end(), [](auto* a, auto* b) { return a->begin < b->begin; });
    for (std::size_t i = 1; i < by_offset.size(); ++i)
      if (by_offset[i]->begin < by_offset[i - 1]->end)
        fail(path_,
             fmt::format("tensor '{}' bytes [{}, {}) overlap tensor '{}' bytes [{}, {}) (header lies about offsets)",
                         by_offset[i]->name, by_offset[i]->begin, by_offset[i]->end, by_offset[i - 1]->name,
                         by_offset[i - 1]->begin, by_offset[i - 1]->end));
  } catch (...) {
    ::munmap(const_cast<uint8_t*>(map_), map_size_);
    map_ = nullptr;
    throw;
  }
}

SafetensorsFile::~SafetensorsFile() {
  if (map_) ::munmap(const_cast<uint8_t*>(map_), map_size_);
}

void SafetensorsFile::release_pages() const {
  // A read-only private mapping that was never written: MADV_DONTNEED only unmaps the pages.
  if (::madvise(const_cast<uint8_t*>(map_), map_size_, MADV_DONTNEED) != 0)
    fail(path_, fmt::format("cannot release the mapped pages: {}", std::strerror(errno)));
}

void SafetensorsFile::release_pages(const TensorInfo& t) const {
  const std::size_t page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  const std::size_t begin = (data_start_ + t.begin) / page * page, end = data_start_ + t.end;
  if (end > begin && ::madvise(const_cast<uint8_t*>(map_) + begin, end - begin, MADV_DONTNEED) != 0)
    fail(path_, fmt::format("cannot release the mapped pages of tensor '{}': {}", t.name, std::strerror(errno)));
}

const TensorInfo* SafetensorsFile::find(const std::string& name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

std::vector<float> SafetensorsFile::read_float32(const TensorInfo& t) const {
  std::vector<float> out(static_cast<std::size_t>(t.element_count()));
  read_float32(t, 0, out.size(), out.data());
  return out;
}

void SafetensorsFile::read_float32(const TensorInfo& t, uint64_t first, uint64_t count, float* out) const {
  const uint64_t elements = static_cast<uint64_t>(t.element_count());
  if (first > elements || count > elements - first)
    throw std::logic_error(fmt::format("{}: tensor '{}': elements [{}, {} + {}) requested of {}", path_, t.name, first,
                                       first, count, elements));
  const std::size_t n = static_cast<std::size_t>(count);
  if (t.dtype == "F32") {
    std::memcpy(out, map_ + data_start_ + t.begin + first * 4, n * 4);
  } else if (t.dtype == "BF16") {
    const uint8_t* p = map_ + data_start_ + t.begin + first * 2;
    for (std::size_t i = 0; i < n; ++i) {
      const uint32_t bits = static_cast<uint32_t>(p[2 * i] | (p[2 * i + 1] << 8)) << 16;
      std::memcpy(&out[i], &bits, 4);
    }
  } else if (t.dtype == "F16") {
    const uint8_t* p = map_ + data_start_ + t.begin + first * 2;
    for (std::size_t i = 0; i < n; ++i)
      out[i] =
          formats::decode_element(formats::ElementFormat::fp16, static_cast<uint32_t>(p[2 * i] | (p[2 * i + 1] << 8)));
  } else {
    fail(path_, fmt::format("tensor '{}' has dtype {}, expected F32, BF16 or F16", t.name, t.dtype));
  }
}

int64_t SafetensorsFile::count_non_finite(const TensorInfo& t) const {
  // Non-finite: every exponent bit set (IEEE binary32 / bfloat16 / binary16).
  const auto count = [&](auto element, uint32_t exponent_mask) {
    using E = decltype(element);
    const std::size_t n = static_cast<std::size_t>(t.element_count());
    const uint8_t* p = bytes(t);
    int64_t bad = 0;
    for (std::size_t i = 0; i < n; ++i) {
      E bits;
      std::memcpy(&bits, p + i * sizeof(E), sizeof(E));
      bad += (static_cast<uint32_t>(bits) & exponent_mask) == exponent_mask;
    }
    return bad;
  };
  if (t.dtype == "F32") return count(uint32_t{}, 0x7f800000u);
  if (t.dtype == "BF16") return count(uint16_t{}, 0x7f80u);
  if (t.dtype == "F16") return count(uint16_t{}, 0x7c00u);
  fail(path_, fmt::format("tensor '{}' has dtype {}, expected F32, BF16 or F16", t.name, t.dtype));
}

// ---- TensorStore ----------------------------------------------------------------------------

TensorStore::TensorStore(const std::string& model_dir) : dir_(model_dir) {
  namespace fs = std::filesystem;
  const fs::path dir(model_dir);
  const fs::path index = dir / "model.safetensors.index.json";
  const fs::path single = dir / "model.safetensors";
  const bool has_index = fs::exists(index) || fs::is_symlink(index);
  const bool has_single = fs::exists(single) || fs::is_symlink(single);  // a dangling link is named when opened
  // transformers would read model.safetensors, an index-first reader the shards: refuse to guess.
  if (has_index && has_single)
    throw std::runtime_error(
        fmt::format("{}: both model.safetensors and model.safetensors.index.json are present (expected one of them: "
                    "which weights are meant?)",
                    model_dir));
  if (has_index) {
    const nlohmann::json j = read_json_file(index.string());
    if (!j.contains("weight_map") || !j["weight_map"].is_object() || j["weight_map"].empty())
      throw std::runtime_error(fmt::format(
          "{}: missing or empty \"weight_map\" object (expected {{tensor name: shard file}})", index.string()));
    std::map<std::string, const SafetensorsFile*> opened;
    for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
      if (!it.value().is_string())
        throw std::runtime_error(fmt::format("{}: weight_map entry '{}' is not a file name", index.string(), it.key()));
      const std::string shard = it.value().get<std::string>();
      if (shard.find('/') != std::string::npos || shard.find("..") != std::string::npos)
        throw std::runtime_error(
            fmt::format("{}: weight_map entry '{}' names '{}', expected a file in the model directory", index.string(),
                        it.key(), shard));
      auto f = opened.find(shard);
      if (f == opened.end()) {
        const fs::path sp = dir / shard;
        if (!fs::exists(sp))
          throw std::runtime_error(fmt::format("{}: shard '{}' (holding tensor '{}') does not exist", index.string(),
                                               sp.string(), it.key()));
        files_.push_back(std::make_unique<SafetensorsFile>(sp.string()));
        f = opened.emplace(shard, files_.back().get()).first;
      }
      const TensorInfo* t = f->second->find(it.key());
      if (!t)
        throw std::runtime_error(
            fmt::format("{}: the index places tensor '{}' in this shard, but its header has no such "
                        "tensor (index {})",
                        f->second->path(), it.key(), index.string()));
      entries_[it.key()] = Entry{f->second, t};
    }
    // Tensors present in shards but missing from the index are still part of the checkpoint; one
    // stored in two shards is ambiguous (which copy is meant?).
    for (const auto& file : files_)
      for (const auto& [name, t] : file->tensors()) {
        const auto [it, added] = entries_.try_emplace(name, Entry{file.get(), &t});
        if (!added && it->second.file != file.get())
          throw std::runtime_error(fmt::format("{}: tensor '{}' is stored in two shards, {} and {} (expected one copy)",
                                               index.string(), name, it->second.file->path(), file->path()));
      }
  } else if (has_single) {
    files_.push_back(std::make_unique<SafetensorsFile>(single.string()));
    for (const auto& [name, t] : files_.back()->tensors()) entries_[name] = Entry{files_.back().get(), &t};
  } else {
    throw std::runtime_error(
        fmt::format("{}: no model.safetensors or model.safetensors.index.json in the model directory", model_dir));
  }
}

void TensorStore::add_prefix_alias(const std::string& from, const std::string& to) { aliases_.emplace_back(from, to); }
void TensorStore::ignore_prefix(const std::string& prefix) { ignored_.push_back(prefix); }

std::string TensorStore::canonical(const std::string& stored) const {
  for (const auto& [from, to] : aliases_)
    if (stored.rfind(from, 0) == 0) return to + stored.substr(from.size());
  return stored;
}

const TensorStore::Entry* TensorStore::lookup(const std::string& name) const {
  if (auto it = entries_.find(name); it != entries_.end()) return &it->second;
  for (const auto& [from, to] : aliases_)
    if (name.rfind(to, 0) == 0)
      if (auto it = entries_.find(from + name.substr(to.size())); it != entries_.end()) return &it->second;
  return nullptr;
}

bool TensorStore::contains(const std::string& name) const { return lookup(name) != nullptr; }

void TensorStore::release_pages() const {
  for (const auto& f : files_) f->release_pages();
}

std::string TensorStore::files_description() const {
  if (files_.size() == 1) return files_[0]->path();
  return fmt::format("{} ({} shards)", (std::filesystem::path(dir_) / "model.safetensors.index.json").string(),
                     files_.size());
}

std::vector<int64_t> TensorStore::shape_of(const std::string& name) const {
  const Entry* e = lookup(name);
  if (!e) throw std::runtime_error(fmt::format("{}: missing tensor '{}'", files_description(), name));
  return e->info->shape;
}

std::optional<TensorStore::Stored> TensorStore::stored(const std::string& name) const {
  const Entry* e = lookup(name);
  if (!e) return std::nullopt;
  return Stored{e->file, e->info};
}

void TensorStore::mark_used(const std::string& name) {
  const Entry* e = lookup(name);
  if (!e) throw std::logic_error(fmt::format("mark_used: missing tensor '{}'", name));
  const std::lock_guard lock(used_mutex_);
  used_.insert(e->info->name);
}

std::vector<std::string> TensorStore::stored_names() const {
  std::vector<std::string> names;
  for (const auto& [name, _] : entries_) names.push_back(name);
  return names;
}

void TensorStore::check(const std::string& name, const std::vector<int64_t>& expected_shape) {
  const Entry* e = lookup(name);
  if (!e)
    throw std::runtime_error(fmt::format("{}: missing tensor '{}' (expected shape {})", files_description(), name,
                                         shape_string(expected_shape)));
  if (e->info->shape != expected_shape)
    throw std::runtime_error(fmt::format("{}: tensor '{}' has shape {}, expected {}", e->file->path(), e->info->name,
                                         shape_string(e->info->shape), shape_string(expected_shape)));
  if (e->info->dtype != "F32" && e->info->dtype != "BF16" && e->info->dtype != "F16")
    throw std::runtime_error(fmt::format(
        "{}: tensor '{}' has dtype {}, expected F32, BF16 or F16{}", e->file->path(), e->info->name, e->info->dtype,
        e->info->dtype == "F8_E4M3" || e->info->dtype == "U8"
            ? " (a quantized weight needs a quantization config: config.json's quantization_config or "
              "hf_quant_config.json, and is read only where the model expects a weight matrix)"
            : ""));
  const std::lock_guard lock(used_mutex_);
  const bool first_check = used_.insert(e->info->name).second;
  if (const int64_t bad = first_check ? e->file->count_non_finite(*e->info) : 0)
    non_finite_.push_back(NonFiniteTensor{e->info->name, e->file->path(), bad, e->info->element_count()});
}

bool TensorStore::same_values(const std::string& a, const std::string& b) const {
  const Entry *ea = lookup(a), *eb = lookup(b);
  if (!ea || !eb) throw std::logic_error(fmt::format("same_values: missing tensor '{}' or '{}'", a, b));
  const TensorInfo &ta = *ea->info, &tb = *eb->info;
  if (ta.shape != tb.shape) return false;
  if (ta.dtype == tb.dtype) return std::memcmp(ea->file->bytes(ta), eb->file->bytes(tb), ta.end - ta.begin) == 0;
  const std::vector<float> va = ea->file->read_float32(ta), vb = eb->file->read_float32(tb);
  return std::memcmp(va.data(), vb.data(), va.size() * sizeof(float)) == 0;
}

Tensor TensorStore::take(const std::string& name, const std::vector<int64_t>& expected_shape) {
  check(name, expected_shape);
  const Entry* e = lookup(name);
  return Tensor{e->info->shape, e->file->read_float32(*e->info)};
}

void TensorStore::check_all_used(const std::string& what) const {
  std::vector<std::string> extra;
  for (const auto& [name, e] : entries_) {
    if (used_.count(name)) continue;
    const std::string c = canonical(name);
    bool ignored = false;
    for (const auto& p : ignored_) ignored |= c.rfind(p, 0) == 0;
    if (!ignored) extra.push_back(fmt::format("'{}' in {}", name, e.file->path()));
  }
  if (extra.empty()) return;
  const std::size_t shown = std::min<std::size_t>(extra.size(), 5);
  throw std::runtime_error(fmt::format("{}: {} unexpected tensor(s) not used by the {} model: {}{}", dir_, extra.size(),
                                       what, fmt::join(extra.begin(), extra.begin() + static_cast<long>(shown), ", "),
                                       extra.size() > shown ? ", ..." : ""));
}

}  // namespace replayssm::model
