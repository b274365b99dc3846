// NumPy .npy files (format versions 1.0-3.0), the toolkit's exchange format for tensors, and the
// one reader and writer of them in the project.
// No packaged C++ library for .npy exists in Debian. The header is a Python dict literal, read here
// by a small literal parser and validated as numpy.lib.format does (numpy is the oracle in
// tests/python/test_cli_quantize.py): the same versions, header-size limit, keys (a duplicate key:
// the last one wins, as in Python), shape (a tuple of non-negative ints whose byte size fits in
// int64) and dtype spellings. Big-endian and Fortran-ordered arrays are converted losslessly to
// little-endian C order, as np.load presents them. One deliberate difference: numpy ignores bytes
// after the data, this reader refuses them (the shape does not describe the file).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace replayssm::io {

class AtomicFile;  // io/atomic_file.h

struct NpyArray {
  std::string dtype;                 // canonical little-endian descr: "<f4", "<i8", "|u1", ...
  std::vector<std::size_t> shape;    // C order; () is a 0-d array of one element
  std::vector<uint8_t> data;         // raw little-endian bytes, C order
  std::size_t element_count() const;  // the reader guarantees it does not overflow
};

// Throws std::runtime_error naming the file, the header field and what was expected.
NpyArray read_npy(const std::string& path);

// Reads a float32 array; a different dtype is an error naming the file, the dtype found and
// the dtype expected (the toolkit never converts values silently).
NpyArray read_npy_float32(const std::string& path);
std::vector<float> as_floats(const NpyArray& a);

// A shape as numpy prints it: "(2, 3)", "(5,)", "()".
std::string shape_text(const std::vector<std::size_t>& shape);

// Product of the dimensions, or std::invalid_argument naming `what` when it (times elem_size
// bytes) does not fit in int64, numpy's limit.
std::size_t checked_element_count(const std::vector<std::size_t>& shape, std::size_t elem_size,
                                  const std::string& what);

// Streams a C-order array into an atomic output: the header, then exactly the promised bytes in
// order. finish() checks the byte count and syncs the temporary; commit() (or commit_together on
// several) makes it visible. Destroyed without commit, the temporary is removed.
class NpyWriter {
 public:
  NpyWriter(const std::string& path, const std::string& dtype, const std::vector<std::size_t>& shape,
            bool replace_existing = true);
  ~NpyWriter();
  NpyWriter(const NpyWriter&) = delete;
  NpyWriter& operator=(const NpyWriter&) = delete;
  void write(const void* data, std::size_t bytes);
  void finish();
  void commit();
  AtomicFile& file() { return *file_; }

 private:
  std::unique_ptr<AtomicFile> file_;
  std::size_t expected_ = 0, written_ = 0;
};

// Whole arrays, written atomically (replacing an existing file).
void write_npy(const std::string& path, const std::string& dtype, const std::vector<std::size_t>& shape,
               const void* data, std::size_t bytes);
void write_npy_float32(const std::string& path, const std::vector<std::size_t>& shape, const float* data);

}  // namespace replayssm::io
