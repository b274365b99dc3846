#include "io/hdf5.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <stdexcept>

#include <fmt/format.h>
#include <hdf5_hl.h>

#include "io/atomic_file.h"

namespace replayssm::io::h5 {

namespace fs = std::filesystem;

namespace {

void init() {
  static const bool done = [] {
    H5open();
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);  // errors are reported by exceptions instead
    return true;
  }();
  (void)done;
}

// HDF5's error stack as one line; clears it.
std::string error_stack() {
  std::string msg;
  H5Ewalk2(
      H5E_DEFAULT, H5E_WALK_DOWNWARD,
      [](unsigned, const H5E_error2_t* e, void* data) -> herr_t {
        auto* s = static_cast<std::string*>(data);
        if (e->desc && *e->desc) {
          if (!s->empty()) *s += "; ";
          *s += e->desc;
        }
        return 0;
      },
      &msg);
  H5Eclear2(H5E_DEFAULT);
  return msg.empty() ? "HDF5 error" : msg;
}

// The file holding `loc` and the path of the object `name` under it (name empty: `loc` itself).
struct Where {
  std::string file, path;
  std::string str() const { return file + ": " + path; }
};
// H5Fget_name / H5Iget_name into a string ("" when HDF5 cannot say).
std::string name_of(hid_t id, ssize_t (*get)(hid_t, char*, std::size_t)) {
  const ssize_t n = get(id, nullptr, 0);
  if (n <= 0) return {};
  std::vector<char> buf(static_cast<std::size_t>(n) + 1, '\0');
  get(id, buf.data(), buf.size());
  return std::string(buf.data(), static_cast<std::size_t>(n));
}

Where where(hid_t loc, const std::string& name) {
  const std::string file = name_of(loc, H5Fget_name);
  std::string path = name_of(loc, H5Iget_name);
  if (!name.empty()) {
    if (path.empty() || path.back() != '/') path.push_back('/');
    path.append(name);
  }
  H5Eclear2(H5E_DEFAULT);
  return Where{file.empty() ? std::string("?") : file, path.empty() ? std::string(1, '/') : path};
}

// Throws "FILE: /PATH: WHAT: <HDF5 error stack>".
[[noreturn]] void fail(hid_t loc, const std::string& name, const std::string& what) {
  const std::string stack = error_stack();  // before where(): every API call clears the stack
  throw std::runtime_error(fmt::format("{}: {}: {}", where(loc, name).str(), what, stack));
}
// For calls that involve no file yet (types, property lists, dataspaces).
[[noreturn]] void fail(const std::string& what) { throw std::runtime_error(fmt::format("{}: {}", what, error_stack())); }

hid_t check(hid_t id, const std::string& what) {
  if (id < 0) fail(what);
  return id;
}
hid_t check(hid_t id, hid_t loc, const std::string& name, const std::string& what) {
  if (id < 0) fail(loc, name, what);
  return id;
}
void check_status(herr_t status, hid_t loc, const std::string& name, const std::string& what) {
  if (status < 0) fail(loc, name, what);
}
void check_status(herr_t status, const std::string& what) {
  if (status < 0) fail(what);
}

template <class T>
struct Types;
template <>
struct Types<float> {
  static hid_t mem() { return H5T_NATIVE_FLOAT; }
  static hid_t file() { return H5T_IEEE_F32LE; }
  static constexpr H5T_class_t kClass = H5T_FLOAT;
  static constexpr const char* kName = "float32";
};
template <>
struct Types<double> {
  static hid_t mem() { return H5T_NATIVE_DOUBLE; }
  static hid_t file() { return H5T_IEEE_F64LE; }
  static constexpr H5T_class_t kClass = H5T_FLOAT;
  static constexpr const char* kName = "float64";
};
template <>
struct Types<int32_t> {
  static hid_t mem() { return H5T_NATIVE_INT32; }
  static hid_t file() { return H5T_STD_I32LE; }
  static constexpr H5T_class_t kClass = H5T_INTEGER;
  static constexpr const char* kName = "int32";
};
template <>
struct Types<int64_t> {
  static hid_t mem() { return H5T_NATIVE_INT64; }
  static hid_t file() { return H5T_STD_I64LE; }
  static constexpr H5T_class_t kClass = H5T_INTEGER;
  static constexpr const char* kName = "int64";
};

// Refuses a stored type that T cannot hold exactly: another class (HDF5 would convert floats to
// integers by truncation) or a wider type (it would round or clamp). Unsigned integers of T's
// width would wrap and are refused too.
template <class T>
void check_stored_type(hid_t type, hid_t loc, const std::string& name, const char* kind) {
  const H5T_class_t cls = H5Tget_class(type);
  const std::size_t size = H5Tget_size(type);
  bool ok = cls == Types<T>::kClass && size <= sizeof(T);
  if (ok && cls == H5T_INTEGER && size == sizeof(T)) ok = H5Tget_sign(type) == H5T_SGN_2;
  if (!ok) {
    const char* stored = cls == H5T_FLOAT     ? "float"
                         : cls == H5T_INTEGER ? (H5Tget_sign(type) == H5T_SGN_2 ? "int" : "uint")
                         : cls == H5T_STRING  ? "string"
                                              : "non-numeric";
    throw std::runtime_error(fmt::format("{}: {} holds {}{}, expected {}", where(loc, name).str(), kind, stored,
                                         cls == H5T_STRING ? "" : std::to_string(8 * size), Types<T>::kName));
  }
}

Handle vlen_string_type() {
  Handle t(check(H5Tcopy(H5T_C_S1), "H5Tcopy"), H5Tclose);
  check_status(H5Tset_size(t, H5T_VARIABLE), "H5Tset_size");
  check_status(H5Tset_cset(t, H5T_CSET_UTF8), "H5Tset_cset");
  return t;
}

Handle simple_space(const std::vector<hsize_t>& dims) {
  if (dims.empty()) return Handle(check(H5Screate(H5S_SCALAR), "H5Screate"), H5Sclose);
  return Handle(check(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr), "H5Screate_simple"),
                H5Sclose);
}

// The extent of a dataset or attribute dataspace.
std::vector<hsize_t> extent(hid_t space, hid_t loc, const std::string& name) {
  const int rank = H5Sget_simple_extent_ndims(space);
  if (rank < 0) fail(loc, name, "cannot read the dataspace");
  std::vector<hsize_t> dims(static_cast<std::size_t>(rank));
  if (rank > 0 && H5Sget_simple_extent_dims(space, dims.data(), nullptr) < 0) fail(loc, name, "cannot read the extent");
  return dims;
}

hsize_t element_count(const std::vector<hsize_t>& dims) {
  hsize_t n = 1;
  for (hsize_t x : dims) n *= x;
  return n;
}

Handle compressed_dcpl(const std::vector<hsize_t>& dims, std::vector<hsize_t> chunk) {
  Handle dcpl(check(H5Pcreate(H5P_DATASET_CREATE), "H5Pcreate"), H5Pclose);
  if (dims.empty() || chunk.empty()) return dcpl;
  for (hsize_t d : dims)
    if (d == 0) return dcpl;  // empty datasets stay contiguous
  for (std::size_t i = 0; i < chunk.size(); ++i) chunk[i] = std::max<hsize_t>(1, std::min(chunk[i], dims[i]));
  check_status(H5Pset_chunk(dcpl, static_cast<int>(chunk.size()), chunk.data()), "H5Pset_chunk");
  check_status(H5Pset_shuffle(dcpl), "H5Pset_shuffle");
  check_status(H5Pset_deflate(dcpl, 4), "H5Pset_deflate");
  return dcpl;
}

void remove_attr_if_exists(hid_t obj, const std::string& name) {
  if (has_attr(obj, name)) check_status(H5Adelete(obj, name.c_str()), obj, "", "cannot delete attribute " + name);
}

Handle open_attr(hid_t obj, const std::string& name) {
  if (!has_attr(obj, name)) {
    const Where w = where(obj, "");
    throw std::runtime_error(fmt::format("{}: no attribute {} on {}", w.file, name, w.path));
  }
  return Handle(check(H5Aopen(obj, name.c_str(), H5P_DEFAULT), obj, "", "cannot open attribute " + name), H5Aclose);
}


template <class T>
T read_scalar_attr(hid_t obj, const std::string& name) {
  Handle a = open_attr(obj, name);
  Handle type(check(H5Aget_type(a), obj, "", "cannot read the type of attribute " + name), H5Tclose);
  check_stored_type<T>(type, obj, "", ("attribute " + name).c_str());
  Handle space(check(H5Aget_space(a), obj, "", "cannot read attribute " + name), H5Sclose);
  if (element_count(extent(space, obj, "")) != 1)
    throw std::runtime_error(fmt::format("{}: attribute {} holds several values, expected one", where(obj, "").str(), name));
  T v{};
  check_status(H5Aread(a, Types<T>::mem(), &v), obj, "", "cannot read attribute " + name);
  return v;
}

// One value: a scalar attribute (what h5py shows as a plain number); several: a 1-D array.
template <class T>
void write_numeric_attr(hid_t obj, const std::string& name, std::span<const T> values) {
  init();
  remove_attr_if_exists(obj, name);
  Handle space = values.size() == 1 ? simple_space({}) : simple_space({values.size()});
  Handle a(check(H5Acreate2(obj, name.c_str(), Types<T>::file(), space, H5P_DEFAULT, H5P_DEFAULT), obj, "",
                 "cannot create attribute " + name),
           H5Aclose);
  check_status(H5Awrite(a, Types<T>::mem(), values.data()), obj, "", "cannot write attribute " + name);
}

}  // namespace

// ---- handles and files ----------------------------------------------------------------------------

Handle& Handle::operator=(Handle&& o) noexcept {
  if (this != &o) {
    reset();
    id_ = o.id_;
    close_ = o.close_;
    o.id_ = H5I_INVALID_HID;
  }
  return *this;
}

void Handle::reset() {
  if (id_ >= 0 && close_) close_(id_);
  id_ = H5I_INVALID_HID;
}

void Handle::close(const std::string& what) {
  const hid_t id = id_;
  id_ = H5I_INVALID_HID;
  if (id >= 0 && close_ && close_(id) < 0) fail(what);
}

NewFile::NewFile(std::string path) : path_(std::move(path)) {
  init();
  Handle fapl(check(H5Pcreate(H5P_FILE_ACCESS), "H5Pcreate"), H5Pclose);
  // Grows in 4 MiB steps; backing_store = false: nothing is written when the file is closed.
  check_status(H5Pset_fapl_core(fapl, std::size_t{4} << 20, false), "H5Pset_fapl_core");
  // The name is only a label in memory (and what error messages show).
  file_ = Handle(check(H5Fcreate(path_.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl), "cannot create " + path_ + " in memory"),
                 H5Fclose);
}

void NewFile::commit() {
  check_status(H5Fflush(file_, H5F_SCOPE_GLOBAL), file_, "", "cannot flush");
  const ssize_t size = H5Fget_file_image(file_, nullptr, 0);
  if (size < 0) fail(file_, "", "cannot take the file image");
  std::vector<char> image(static_cast<std::size_t>(size));
  if (H5Fget_file_image(file_, image.data(), image.size()) != size) fail(file_, "", "cannot copy the file image");
  file_.close("closing " + path_);
  try {
    write_file_atomically(path_, image.data(), image.size());
  } catch (const std::exception& e) {
    throw std::runtime_error(fmt::format("cannot write {}: {}", path_, e.what()));
  }
}

Handle open_file(const std::string& path) {
  init();
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (!fs::exists(st)) throw std::runtime_error(fmt::format("{}: no such file", path));
  if (fs::is_directory(st)) throw std::runtime_error(fmt::format("{}: is a directory, expected an HDF5 file", path));
  const htri_t is = H5Fis_hdf5(path.c_str());
  if (is <= 0) {
    H5Eclear2(H5E_DEFAULT);
    throw std::runtime_error(fmt::format("{}: not an HDF5 file", path));
  }
  const hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  if (f < 0) fail(fmt::format("{}: cannot open (a damaged or truncated HDF5 file?)", path));
  return Handle(f, H5Fclose);
}

// ---- groups, links, attributes --------------------------------------------------------------------

Handle create_group(hid_t loc, const std::string& name) {
  init();
  Handle gcpl(check(H5Pcreate(H5P_GROUP_CREATE), "H5Pcreate"), H5Pclose);
  check_status(H5Pset_link_creation_order(gcpl, H5P_CRT_ORDER_TRACKED | H5P_CRT_ORDER_INDEXED),
               "H5Pset_link_creation_order");
  return Handle(check(H5Gcreate2(loc, name.c_str(), H5P_DEFAULT, gcpl, H5P_DEFAULT), loc, name, "cannot create group"),
                H5Gclose);
}

Handle open_group(hid_t loc, const std::string& name) {
  init();
  if (!has_link(loc, name)) {
    const Where w = where(loc, name);
    throw std::runtime_error(fmt::format("{}: no group {}", w.file, w.path));
  }
  return Handle(check(H5Gopen2(loc, name.c_str(), H5P_DEFAULT), loc, name, "not a group"), H5Gclose);
}

Handle open_dataset(hid_t loc, const std::string& name) {
  if (!has_link(loc, name)) {
    const Where w = where(loc, name);
    throw std::runtime_error(fmt::format("{}: no dataset {}", w.file, w.path));
  }
  return Handle(check(H5Dopen2(loc, name.c_str(), H5P_DEFAULT), loc, name, "not a dataset"), H5Dclose);
}

bool has_link(hid_t loc, const std::string& name) {
  init();
  // H5Lexists fails (rather than says no) when a parent is missing: check "a", "a/b", "a/b/c".
  for (std::size_t end = name.find('/'); ; end = name.find('/', end + 1)) {
    const std::string prefix = name.substr(0, end);
    const htri_t r = H5Lexists(loc, prefix.c_str(), H5P_DEFAULT);
    if (r < 0) fail(loc, prefix, "cannot look up the link");
    if (r == 0) return false;
    if (end == std::string::npos) break;
  }
  return true;
}

bool has_attr(hid_t obj, const std::string& name) {
  init();
  const htri_t r = H5Aexists(obj, name.c_str());
  if (r < 0) fail(obj, "", "cannot look up attribute " + name);
  return r > 0;
}

void write_attr(hid_t obj, const std::string& name, const std::string& value) {
  init();
  remove_attr_if_exists(obj, name);
  Handle type = vlen_string_type();
  Handle space = simple_space({});
  Handle a(check(H5Acreate2(obj, name.c_str(), type, space, H5P_DEFAULT, H5P_DEFAULT), obj, "",
                 "cannot create attribute " + name),
           H5Aclose);
  const char* p = value.c_str();
  check_status(H5Awrite(a, type, &p), obj, "", "cannot write attribute " + name);
}

void write_attr(hid_t obj, const std::string& name, int64_t value) {
  write_numeric_attr<int64_t>(obj, name, std::span<const int64_t>(&value, 1));
}

void write_attr(hid_t obj, const std::string& name, double value) {
  write_numeric_attr<double>(obj, name, std::span<const double>(&value, 1));
}

void write_attr(hid_t obj, const std::string& name, std::span<const double> values) {
  write_numeric_attr<double>(obj, name, values);
}

std::string read_attr_string(hid_t obj, const std::string& name) {
  init();
  Handle a = open_attr(obj, name);
  Handle type(check(H5Aget_type(a), obj, "", "cannot read the type of attribute " + name), H5Tclose);
  if (H5Tget_class(type) != H5T_STRING)
    throw std::runtime_error(fmt::format("{}: attribute {} is not a string", where(obj, "").str(), name));
  if (H5Tis_variable_str(type) > 0) {
    Handle mem = vlen_string_type();
    char* p = nullptr;
    check_status(H5Aread(a, mem, &p), obj, "", "cannot read attribute " + name);
    std::string s = p ? p : "";
    H5free_memory(p);
    return s;
  }
  const std::size_t size = H5Tget_size(type);
  std::string s(size, '\0');
  Handle mem(check(H5Tcopy(H5T_C_S1), "H5Tcopy"), H5Tclose);
  check_status(H5Tset_size(mem, size), "H5Tset_size");
  check_status(H5Aread(a, mem, s.data()), obj, "", "cannot read attribute " + name);
  s.resize(std::strlen(s.c_str()));
  return s;
}

int64_t read_attr_int(hid_t obj, const std::string& name) {
  init();
  return read_scalar_attr<int64_t>(obj, name);
}

double read_attr_double(hid_t obj, const std::string& name) {
  init();
  return read_scalar_attr<double>(obj, name);
}

// ---- datasets ----------------------------------------------------------------------------------

template <class T>
void write_dataset(hid_t loc, const std::string& name, const std::vector<hsize_t>& dims, const T* data,
                   const std::vector<hsize_t>& chunk) {
  init();
  Handle space = simple_space(dims);
  Handle dcpl = compressed_dcpl(dims, chunk);
  Handle d(check(H5Dcreate2(loc, name.c_str(), Types<T>::file(), space, H5P_DEFAULT, dcpl, H5P_DEFAULT), loc, name,
                 "cannot create dataset"),
           H5Dclose);
  if (element_count(dims) > 0)
    check_status(H5Dwrite(d, Types<T>::mem(), H5S_ALL, H5S_ALL, H5P_DEFAULT, data), loc, name, "cannot write");
}

template <class T>
std::vector<T> read_dataset(hid_t loc, const std::string& name, std::vector<hsize_t>* dims_out) {
  init();
  Handle d = open_dataset(loc, name);
  Handle type(check(H5Dget_type(d), loc, name, "cannot read the type"), H5Tclose);
  check_stored_type<T>(type, loc, name, "dataset");
  Handle space(check(H5Dget_space(d), loc, name, "cannot read the dataspace"), H5Sclose);
  const std::vector<hsize_t> dims = extent(space, loc, name);
  std::vector<T> v(element_count(dims));
  if (!v.empty()) check_status(H5Dread(d, Types<T>::mem(), H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data()), loc, name, "cannot read");
  if (dims_out) *dims_out = dims;
  return v;
}

template <class T>
T read_scalar(hid_t loc, const std::string& name) {
  const std::vector<T> v = read_dataset<T>(loc, name);
  if (v.size() != 1)
    throw std::runtime_error(fmt::format("{}: holds {} values, expected a scalar", where(loc, name).str(), v.size()));
  return v[0];
}

#define REPLAYSSM_H5_INSTANTIATE(T)                                                                          \
  template void write_dataset<T>(hid_t, const std::string&, const std::vector<hsize_t>&, const T*,            \
                                 const std::vector<hsize_t>&);                                              \
  template std::vector<T> read_dataset<T>(hid_t, const std::string&, std::vector<hsize_t>*);                 \
  template T read_scalar<T>(hid_t, const std::string&);
REPLAYSSM_H5_INSTANTIATE(float)
REPLAYSSM_H5_INSTANTIATE(double)
REPLAYSSM_H5_INSTANTIATE(int32_t)
REPLAYSSM_H5_INSTANTIATE(int64_t)
#undef REPLAYSSM_H5_INSTANTIATE

void make_dimension_scale(hid_t loc, const std::string& name, const std::string& label) {
  init();
  const Handle d = open_dataset(loc, name);
  check_status(H5DSset_scale(d, label.c_str()), loc, name, "cannot make a dimension scale of");
}

void attach_dimension_scale(hid_t loc, const std::string& name, const std::string& root_scale, unsigned dim) {
  init();
  const Handle d = open_dataset(loc, name);
  const Handle file(check(H5Iget_file_id(loc), "H5Iget_file_id"), H5Fclose);
  const Handle scale = open_dataset(file, root_scale);
  check_status(H5DSattach_scale(d, scale, dim), loc, name,
               fmt::format("cannot attach the scale /{} to dimension {} of", root_scale, dim));
}

void write_strings(hid_t loc, const std::string& name, const std::vector<std::string>& values) {
  init();
  Handle type = vlen_string_type();
  Handle space = simple_space({values.size()});
  Handle d(check(H5Dcreate2(loc, name.c_str(), type, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), loc, name,
                 "cannot create dataset"),
           H5Dclose);
  std::vector<const char*> p;
  p.reserve(values.size());
  for (const auto& s : values) p.push_back(s.c_str());
  if (!p.empty()) check_status(H5Dwrite(d, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, p.data()), loc, name, "cannot write");
}

std::vector<std::string> read_strings(hid_t loc, const std::string& name) {
  init();
  Handle d = open_dataset(loc, name);
  Handle stored(check(H5Dget_type(d), loc, name, "cannot read the type"), H5Tclose);
  if (H5Tget_class(stored) != H5T_STRING || H5Tis_variable_str(stored) <= 0)
    throw std::runtime_error(fmt::format("{}: expected variable-length strings", where(loc, name).str()));
  Handle space(check(H5Dget_space(d), loc, name, "cannot read the dataspace"), H5Sclose);
  const hssize_t n = H5Sget_simple_extent_npoints(space);
  if (n < 0) fail(loc, name, "cannot read the extent");
  Handle type = vlen_string_type();
  std::vector<char*> p(static_cast<std::size_t>(n), nullptr);
  if (n > 0) check_status(H5Dread(d, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, p.data()), loc, name, "cannot read");
  std::vector<std::string> out;
  out.reserve(p.size());
  for (char* s : p) out.emplace_back(s ? s : "");
  if (n > 0) {
#if H5_VERSION_GE(1, 12, 0)
    H5Treclaim(type, space, H5P_DEFAULT, p.data());
#else
    H5Dvlen_reclaim(type, space, H5P_DEFAULT, p.data());
#endif
  }
  return out;
}

RowWriter::RowWriter(hid_t loc, const std::string& name, hsize_t rows, hsize_t cols) : rows_(rows), cols_(cols) {
  init();
  const std::vector<hsize_t> dims{rows, cols};
  file_space_ = simple_space(dims);
  Handle dcpl = compressed_dcpl(dims, {1, std::min<hsize_t>(cols, 65536)});
  dataset_ = Handle(check(H5Dcreate2(loc, name.c_str(), H5T_IEEE_F32LE, file_space_, H5P_DEFAULT, dcpl, H5P_DEFAULT),
                          loc, name, "cannot create dataset"),
                    H5Dclose);
}

void RowWriter::write_row(hsize_t row, std::span<const float> values) {
  if (row >= rows_ || values.size() != cols_)
    throw std::invalid_argument(fmt::format("{}: row {} of {} with {} values (expected {})", where(dataset_, "").str(), row,
                                            rows_, values.size(), cols_));
  if (cols_ == 0) return;
  const hsize_t start[2] = {row, 0}, count[2] = {1, cols_};
  check_status(H5Sselect_hyperslab(file_space_, H5S_SELECT_SET, start, nullptr, count, nullptr), "select row");
  Handle mem = simple_space({1, cols_});
  check_status(H5Dwrite(dataset_, H5T_NATIVE_FLOAT, mem, file_space_, H5P_DEFAULT, values.data()), dataset_, "",
               fmt::format("cannot write row {}", row));
}

std::vector<float> read_row(hid_t loc, const std::string& name, hsize_t row) {
  init();
  Handle d = open_dataset(loc, name);
  Handle type(check(H5Dget_type(d), loc, name, "cannot read the type"), H5Tclose);
  check_stored_type<float>(type, loc, name, "dataset");
  Handle space(check(H5Dget_space(d), loc, name, "cannot read the dataspace"), H5Sclose);
  const std::vector<hsize_t> dims = extent(space, loc, name);
  if (dims.size() != 2) throw std::runtime_error(fmt::format("{}: not 2-D", where(loc, name).str()));
  if (row >= dims[0]) throw std::out_of_range(fmt::format("{}: row {} of {}", where(loc, name).str(), row, dims[0]));
  std::vector<float> v(dims[1]);
  if (dims[1] == 0) return v;
  const hsize_t start[2] = {row, 0}, count[2] = {1, dims[1]};
  check_status(H5Sselect_hyperslab(space, H5S_SELECT_SET, start, nullptr, count, nullptr), "select row");
  Handle mem = simple_space({1, dims[1]});
  check_status(H5Dread(d, H5T_NATIVE_FLOAT, mem, space, H5P_DEFAULT, v.data()), loc, name, "cannot read");
  return v;
}

}  // namespace replayssm::io::h5
