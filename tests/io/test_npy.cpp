#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>

#include "io/npy.h"

using namespace replayssm::io;

TEST_CASE("npy round trip and clear errors") {
  const auto dir = std::filesystem::temp_directory_path() / "replayssm_test_npy";
  std::filesystem::create_directories(dir);
  const std::string path = (dir / "a.npy").string();
  const float data[6] = {1, -2, 3.5f, 0, -0.0f, 7};
  write_npy_float32(path, {2, 3}, data);
  const NpyArray a = read_npy_float32(path);
  CHECK(a.shape == std::vector<std::size_t>{2, 3});
  CHECK(as_floats(a) == std::vector<float>(data, data + 6));

  const uint16_t u[2] = {1, 2};
  write_npy((dir / "u.npy").string(), "<u2", {2}, u, 4);
  CHECK_THROWS_WITH(read_npy_float32((dir / "u.npy").string()), doctest::Contains("expected float32"));

  {  // truncate
    std::ifstream in(path, std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), {});
    std::ofstream out((dir / "t.npy").string(), std::ios::binary);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size() - 5));
  }
  CHECK_THROWS_WITH(read_npy((dir / "t.npy").string()), doctest::Contains("truncated data"));
  {
    std::ofstream out((dir / "bad.npy").string());
    out << "hello world";
  }
  CHECK_THROWS_WITH(read_npy((dir / "bad.npy").string()), doctest::Contains("not a .npy file"));
  CHECK_THROWS_WITH(read_npy((dir / "missing.npy").string()), doctest::Contains("cannot open"));
  std::filesystem::remove_all(dir);
}

namespace {
std::string npy_file(const std::filesystem::path& p, const std::string& header, const std::string& data,
                     int major = 1, long header_len = -1) {
  std::string bytes = std::string("\x93NUMPY", 6) + static_cast<char>(major) + '\0';
  const std::size_t n = header_len < 0 ? header.size() : static_cast<std::size_t>(header_len);
  for (int i = 0; i < (major == 1 ? 2 : 4); ++i) bytes += static_cast<char>((n >> (8 * i)) & 0xFF);
  bytes += header + data;
  std::ofstream(p, std::ios::binary) << bytes;
  return p.string();
}
}  // namespace

TEST_CASE("npy header validated as numpy validates it") {
  const auto dir = std::filesystem::temp_directory_path() / "replayssm_test_npy_header";
  std::filesystem::create_directories(dir);
  const std::string f32x8(32, '\0');
  auto header = [](const std::string& descr, const std::string& shape) {
    return "{'descr': " + descr + ", 'fortran_order': False, 'shape': " + shape + "}\n";
  };
  // Negative and non-integer dimensions were read as (4, 32) by the regex reader.
  CHECK_THROWS_WITH(read_npy(npy_file(dir / "neg.npy", header("'<f4'", "(-4, 2)"), f32x8)),
                    doctest::Contains("neg.npy: .npy header field 'shape' is (-4, 2): expected a tuple of non-negative"));
  CHECK_THROWS_WITH(read_npy(npy_file(dir / "x.npy", header("'<f4'", "(4,'x',2)"), f32x8)),
                    doctest::Contains("x.npy: .npy header field 'shape' is (4,'x',2): expected a tuple of non-negative integers below 2^63, found 'x'"));
  // Duplicate key: the last one wins, as in a Python dict literal.
  const NpyArray dup = read_npy(npy_file(
      dir / "dup.npy", "{'descr': '<i8', 'fortran_order': False, 'shape': (8,), 'descr': '<f4'}", f32x8));
  CHECK(dup.dtype == "<f4");
  CHECK(dup.shape == std::vector<std::size_t>{8});
  // Huge header length: refused from the length field, named, nothing allocated.
  CHECK_THROWS_WITH(read_npy(npy_file(dir / "h.npy", header("'<f4'", "(8,)"), f32x8, 2, 0xFFFFFFFFL)),
                    doctest::Contains("h.npy: .npy header length field says 4294967295 bytes"));
  CHECK_THROWS_WITH(read_npy(npy_file(dir / "h2.npy", header("'<f4'", "(8,)"), f32x8, 2, 9000)),
                    doctest::Contains("h2.npy: truncated .npy file: the header length field says 9000 bytes"));
  // Byte count overflow: (2^62 + 2) * 4 elements wraps to 8 in 64 bits.
  CHECK_THROWS_WITH(read_npy(npy_file(dir / "o.npy", header("'<f4'", "(4611686018427387906, 4)"), f32x8)),
                    doctest::Contains("o.npy: shape (4611686018427387906, 4) has more than 2^63 bytes"));
  CHECK_THROWS_WITH(read_npy(npy_file(dir / "big.npy", header("'<f4'", "(99999999999999999999, 4)"), f32x8)),
                    doctest::Contains("big.npy: .npy header field 'shape'"));
  CHECK_THROWS_WITH(read_npy(npy_file(dir / "k.npy", "{'descr': '<f4', 'shape': (8,)}", f32x8)),
                    doctest::Contains("k.npy: .npy header has the keys ['descr', 'shape']: expected exactly"));
  CHECK_THROWS_WITH(read_npy(npy_file(dir / "v.npy", header("'<f4'", "(8,)"), f32x8, 4)),
                    doctest::Contains("v.npy: unsupported .npy format version 4.0"));
  CHECK_THROWS_WITH(read_npy(npy_file(dir / "t.npy", header("'<f4'", "(7,)"), f32x8)),
                    doctest::Contains("t.npy: 4 bytes after the data"));
  CHECK_THROWS_WITH(read_npy(dir.string()), doctest::Contains("is a directory, expected a .npy file"));

  // Big-endian and Fortran order are converted, as np.load presents them.
  const std::string be = {0, 0, 0, 1, 0, 0, 0, 2};
  const NpyArray b = read_npy(npy_file(dir / "be.npy", header("'>i4'", "(2,)"), be));
  CHECK(b.dtype == "<i4");
  CHECK(b.data == std::vector<uint8_t>{1, 0, 0, 0, 2, 0, 0, 0});
  const std::string fortran = {1, 4, 2, 5, 3, 6};  // [[1,2,3],[4,5,6]] column by column
  const NpyArray f = read_npy(npy_file(dir / "f.npy", "{'descr': '|u1', 'fortran_order': True, 'shape': (2, 3)}", fortran));
  CHECK(f.data == std::vector<uint8_t>{1, 2, 3, 4, 5, 6});
  std::filesystem::remove_all(dir);
}

TEST_CASE("npy writer refuses inconsistent sizes and overflowing shapes") {
  const auto dir = std::filesystem::temp_directory_path() / "replayssm_test_npy_writer";
  std::filesystem::create_directories(dir);
  const float x[4] = {1, 2, 3, 4};
  CHECK_THROWS_WITH(write_npy_float32((dir / "o.npy").string(), {std::size_t{1} << 62, 16}, x),
                    doctest::Contains("o.npy: shape (4611686018427387904, 16) has more than 2^63 bytes"));
  CHECK_THROWS_WITH(write_npy((dir / "o.npy").string(), "<f4", {1, 3}, x, sizeof(x)),
                    doctest::Contains("more data than the shape holds"));
  CHECK_THROWS_WITH(write_npy((dir / "o.npy").string(), "<f4", {5}, x, sizeof(x)),
                    doctest::Contains("16 bytes of data written, the shape needs 20"));
  CHECK_FALSE(std::filesystem::exists(dir / "o.npy"));
  for (const auto& e : std::filesystem::directory_iterator(dir)) CHECK(e.path().filename().string().find(".tmp") == std::string::npos);
  std::filesystem::remove_all(dir);
}
