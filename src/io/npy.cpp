#include "io/npy.h"

#include <cstring>
#include <filesystem>
#include <fstream>
#include <regex>
#include <stdexcept>

#include <fmt/format.h>

namespace replayssm::io {

std::size_t NpyArray::element_count() const {
  std::size_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

namespace {

std::size_t dtype_size(const std::string& descr) {
  static const std::pair<const char*, std::size_t> known[] = {
      {"<f4", 4}, {"<f8", 8}, {"<f2", 2}, {"|u1", 1}, {"<u2", 2}, {"<u4", 4}, {"<i4", 4}, {"<i8", 8}, {"<u8", 8},
      {"|i1", 1}, {"<i2", 2}};
  for (auto& [name, size] : known)
    if (descr == name) return size;
  return 0;
}

[[noreturn]] void fail(const std::string& path, const std::string& what) {
  throw std::runtime_error(fmt::format("{}: {}", path, what));
}

}  // namespace

NpyArray read_npy(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(path, "cannot open file for reading");
  char magic[8];
  if (!in.read(magic, 8)) fail(path, "not a .npy file (shorter than the 8-byte magic)");
  if (std::memcmp(magic, "\x93NUMPY", 6) != 0) fail(path, "not a .npy file (magic string \\x93NUMPY missing)");
  const int major = static_cast<unsigned char>(magic[6]);
  uint32_t header_len = 0;
  if (major == 1) {
    unsigned char b[2];
    if (!in.read(reinterpret_cast<char*>(b), 2)) fail(path, "truncated .npy header length");
    header_len = b[0] | (b[1] << 8);
  } else if (major == 2 || major == 3) {
    unsigned char b[4];
    if (!in.read(reinterpret_cast<char*>(b), 4)) fail(path, "truncated .npy header length");
    header_len = b[0] | (b[1] << 8) | (b[2] << 16) | (static_cast<uint32_t>(b[3]) << 24);
  } else {
    fail(path, fmt::format("unsupported .npy format version {}.{} (expected 1.0-3.0)", major, int(magic[7])));
  }
  std::string header(header_len, '\0');
  if (!in.read(header.data(), header_len)) fail(path, "truncated .npy header");

  std::smatch m;
  NpyArray a;
  if (!std::regex_search(header, m, std::regex(R"('descr'\s*:\s*'([^']*)')")))
    fail(path, "malformed .npy header: no 'descr' field");
  a.dtype = m[1];
  if (!std::regex_search(header, m, std::regex(R"('fortran_order'\s*:\s*(True|False))")))
    fail(path, "malformed .npy header: no 'fortran_order' field");
  if (m[1] == "True") fail(path, "Fortran-ordered arrays are not supported: save with np.ascontiguousarray");
  if (!std::regex_search(header, m, std::regex(R"('shape'\s*:\s*\(([^)]*)\))")))
    fail(path, "malformed .npy header: no 'shape' field");
  const std::string dims = m[1];
  const std::regex number(R"(\d+)");
  for (std::sregex_iterator it(dims.begin(), dims.end(), number), end; it != end; ++it)
    a.shape.push_back(std::stoull(it->str()));
  const std::size_t esize = dtype_size(a.dtype);
  if (esize == 0) fail(path, fmt::format("unsupported dtype '{}'", a.dtype));
  const std::size_t bytes = a.element_count() * esize;
  a.data.resize(bytes);
  if (bytes && !in.read(reinterpret_cast<char*>(a.data.data()), static_cast<std::streamsize>(bytes)))
    fail(path, fmt::format("truncated data: header promises {} bytes ({} elements of {}), file has {}", bytes,
                           a.element_count(), a.dtype, in.gcount()));
  return a;
}

NpyArray read_npy_float32(const std::string& path) {
  NpyArray a = read_npy(path);
  if (a.dtype != "<f4")
    fail(path, fmt::format("dtype is '{}', expected float32 ('<f4'); convert with arr.astype(np.float32)", a.dtype));
  return a;
}

std::vector<float> as_floats(const NpyArray& a) {
  std::vector<float> v(a.element_count());
  if (!v.empty()) std::memcpy(v.data(), a.data.data(), v.size() * sizeof(float));
  return v;
}

void write_npy(const std::string& path, const std::string& dtype, const std::vector<std::size_t>& shape,
               const void* data, std::size_t bytes) {
  std::string dims;
  for (auto d : shape) dims += fmt::format("{}, ", d);
  if (shape.size() > 1) dims.resize(dims.size() - 2);  // (n,) keeps its comma, (a, b) does not
  else if (shape.empty()) dims.clear();
  std::string header = fmt::format("{{'descr': '{}', 'fortran_order': False, 'shape': ({}), }}", dtype, dims);
  const std::size_t unpadded = 10 + header.size() + 1;
  header.append((64 - unpadded % 64) % 64, ' ');
  header.push_back('\n');

  const std::filesystem::path target(path);
  const std::filesystem::path tmp = target.string() + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) fail(path, "cannot open for writing");
    const unsigned char prefix[8] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0};
    out.write(reinterpret_cast<const char*>(prefix), 8);
    const uint16_t len = static_cast<uint16_t>(header.size());
    const unsigned char len_bytes[2] = {static_cast<unsigned char>(len & 0xFF), static_cast<unsigned char>(len >> 8)};
    out.write(reinterpret_cast<const char*>(len_bytes), 2);
    out.write(header.data(), static_cast<std::streamsize>(header.size()));
    out.write(static_cast<const char*>(data), static_cast<std::streamsize>(bytes));
    if (!out.flush()) fail(path, "write failed (disk full?)");
  }
  std::filesystem::rename(tmp, target);
}

void write_npy_float32(const std::string& path, const std::vector<std::size_t>& shape, const float* data) {
  std::size_t n = 1;
  for (auto d : shape) n *= d;
  write_npy(path, "<f4", shape, data, n * sizeof(float));
}

}  // namespace replayssm::io
