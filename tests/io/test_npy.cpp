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
