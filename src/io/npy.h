// NumPy .npy files (format versions 1.0-3.0), the toolkit's exchange format for tensors.
// No packaged C++ library for .npy exists in Debian; the format is a short ASCII header
// (a Python dict literal) plus raw data, so a careful reader with precise errors is kept here.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace replayssm::io {

struct NpyArray {
  std::string dtype;                 // numpy descr, e.g. "<f4"
  std::vector<std::size_t> shape;    // C order
  std::vector<uint8_t> data;         // raw little-endian bytes
  std::size_t element_count() const;
};

// Throws std::runtime_error naming the file and what was wrong (not .npy, truncated,
// Fortran order, unsupported dtype).
NpyArray read_npy(const std::string& path);

// Reads a float32 array; a different dtype is an error naming the file, the dtype found and
// the dtype expected (the toolkit never converts silently).
NpyArray read_npy_float32(const std::string& path);
std::vector<float> as_floats(const NpyArray& a);

// Written atomically: a temporary file in the same directory, then rename.
void write_npy(const std::string& path, const std::string& dtype, const std::vector<std::size_t>& shape,
               const void* data, std::size_t bytes);
void write_npy_float32(const std::string& path, const std::vector<std::size_t>& shape, const float* data);

}  // namespace replayssm::io
