// A small RAII layer over the HDF5 C API: identifiers that close themselves, typed attribute and
// dataset helpers, and errors (std::runtime_error) that name the file and object and carry HDF5's
// own error stack. HDF5's printing of errors is switched off.
//
// Every HDF5 file the toolkit writes is a NewFile: built in memory (HDF5's core driver, no backing
// store) and stored by commit() through io::AtomicFile (temporary, fsync, rename). HDF5 itself
// never writes to disk, because with HDF5 1.10 a write that fails inside the library (a full disk,
// a file size limit) leaves the freed file registered, and the library's exit handler then
// crashes on it (HDFFV-11052, fixed upstream in 1.14.1): a full disk ended in a segfault at exit.
// An AtomicFile write fails with errno, names the file and removes its temporary; a reader sees
// the old file or the new one. The cost is memory: the file's size, twice while committing.
#pragma once
#include <hdf5.h>

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace replayssm::io::h5 {

// Owns one HDF5 identifier; closes it with the matching H5*close.
class Handle {
 public:
  Handle() = default;
  Handle(hid_t id, herr_t (*close)(hid_t)) : id_(id), close_(close) {}
  Handle(Handle&& o) noexcept : id_(o.id_), close_(o.close_) { o.id_ = H5I_INVALID_HID; }
  Handle& operator=(Handle&& o) noexcept;
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  ~Handle() { reset(); }
  hid_t get() const { return id_; }
  operator hid_t() const { return id_; }
  // Closes now; errors are ignored (destructors, error paths).
  void reset();
  // Closes now; throws (with `what`) when HDF5 reports a failure.
  void close(const std::string& what);

 private:
  hid_t id_ = H5I_INVALID_HID;
  herr_t (*close_)(hid_t) = nullptr;
};

// A new file, built in memory and written to `path` atomically by commit() (see the top of this
// file). Destroyed without commit(): nothing was written, nothing is left.
class NewFile {
 public:
  explicit NewFile(std::string path);
  NewFile(const NewFile&) = delete;
  NewFile& operator=(const NewFile&) = delete;
  hid_t get() const { return file_; }
  operator hid_t() const { return file_; }
  const std::string& path() const { return path_; }
  // Closes the file and writes its image; throws std::runtime_error naming `path` (ENOSPC, EFBIG...).
  void commit();

 private:
  std::string path_;
  Handle file_;
};

// Read-only. Throws naming the file when it is missing, a directory or not an HDF5 file.
Handle open_file(const std::string& path);
Handle create_group(hid_t loc, const std::string& name);
Handle open_group(hid_t loc, const std::string& name);
Handle open_dataset(hid_t loc, const std::string& name);
bool has_link(hid_t loc, const std::string& name);
bool has_attr(hid_t obj, const std::string& name);

void write_attr(hid_t obj, const std::string& name, const std::string& value);  // variable-length UTF-8
void write_attr(hid_t obj, const std::string& name, int64_t value);
void write_attr(hid_t obj, const std::string& name, double value);
void write_attr(hid_t obj, const std::string& name, std::span<const double> values);
// Readers check the stored type: an integer attribute is not read as a string, a float not as an
// integer (HDF5 would convert, truncating or clamping silently).
std::string read_attr_string(hid_t obj, const std::string& name);
int64_t read_attr_int(hid_t obj, const std::string& name);
double read_attr_double(hid_t obj, const std::string& name);

// Element types: float, double, int32_t, int64_t. dims empty: a scalar dataset. Compressed
// datasets are chunked (chunk dims given, or the whole extent), shuffled and deflated.
template <class T>
void write_dataset(hid_t loc, const std::string& name, const std::vector<hsize_t>& dims, const T* data,
                   const std::vector<hsize_t>& chunk = {});
// Refuses a dataset whose stored class or width does not fit T without rounding or clamping.
template <class T>
std::vector<T> read_dataset(hid_t loc, const std::string& name, std::vector<hsize_t>* dims = nullptr);
// A scalar dataset (or one of a single element).
template <class T>
T read_scalar(hid_t loc, const std::string& name);
void write_strings(hid_t loc, const std::string& name, const std::vector<std::string>& values);
std::vector<std::string> read_strings(hid_t loc, const std::string& name);

// HDF5 dimension scales (the high-level H5DS API), so that netCDF readers (h5netcdf, xarray) see
// named dimensions and their coordinates: dataset `name` in loc becomes the scale `label`, and a
// scale at the file's root (`root_scale`) is attached to dimension `dim` of a dataset.
void make_dimension_scale(hid_t loc, const std::string& name, const std::string& label);
void attach_dimension_scale(hid_t loc, const std::string& name, const std::string& root_scale, unsigned dim);

// A chunked, compressed float32 dataset [rows, cols] written one row at a time.
class RowWriter {
 public:
  RowWriter(hid_t loc, const std::string& name, hsize_t rows, hsize_t cols);
  void write_row(hsize_t row, std::span<const float> values);

 private:
  Handle dataset_, file_space_;
  hsize_t rows_, cols_;
};
// Reads row `row` of a 2-D float32 dataset.
std::vector<float> read_row(hid_t loc, const std::string& name, hsize_t row);

}  // namespace replayssm::io::h5
