#include "io/hdf5_results.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <stdexcept>

#include <fmt/format.h>

namespace replayssm::io {

namespace fs = std::filesystem;

namespace h5 {

namespace {

void init() {
  static const bool done = [] {
    H5open();
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);  // errors are reported by exceptions instead
    return true;
  }();
  (void)done;
}

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

[[noreturn]] void fail(const std::string& what) { throw std::runtime_error(fmt::format("{}: {}", what, error_stack())); }

hid_t check(hid_t id, const std::string& what) {
  if (id < 0) fail(what);
  return id;
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
};
template <>
struct Types<double> {
  static hid_t mem() { return H5T_NATIVE_DOUBLE; }
  static hid_t file() { return H5T_IEEE_F64LE; }
};
template <>
struct Types<int32_t> {
  static hid_t mem() { return H5T_NATIVE_INT32; }
  static hid_t file() { return H5T_STD_I32LE; }
};
template <>
struct Types<int64_t> {
  static hid_t mem() { return H5T_NATIVE_INT64; }
  static hid_t file() { return H5T_STD_I64LE; }
};

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
  if (has_attr(obj, name)) check_status(H5Adelete(obj, name.c_str()), "H5Adelete " + name);
}

}  // namespace

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

Handle create_file(const std::string& path) {
  init();
  return Handle(check(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT), "cannot create " + path),
                H5Fclose);
}

Handle open_file(const std::string& path) {
  init();
  if (!fs::exists(path)) throw std::runtime_error(fmt::format("{}: no such file", path));
  const htri_t is = H5Fis_hdf5(path.c_str());
  if (is <= 0) {
    H5Eclear2(H5E_DEFAULT);
    throw std::runtime_error(fmt::format("{}: not an HDF5 file", path));
  }
  return Handle(check(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), "cannot open " + path), H5Fclose);
}

Handle create_group(hid_t loc, const std::string& name) {
  init();
  Handle gcpl(check(H5Pcreate(H5P_GROUP_CREATE), "H5Pcreate"), H5Pclose);
  check_status(H5Pset_link_creation_order(gcpl, H5P_CRT_ORDER_TRACKED | H5P_CRT_ORDER_INDEXED),
               "H5Pset_link_creation_order");
  return Handle(check(H5Gcreate2(loc, name.c_str(), H5P_DEFAULT, gcpl, H5P_DEFAULT), "cannot create group " + name),
                H5Gclose);
}

Handle open_group(hid_t loc, const std::string& name) {
  init();
  return Handle(check(H5Gopen2(loc, name.c_str(), H5P_DEFAULT), "no group " + name), H5Gclose);
}

bool has_link(hid_t loc, const std::string& name) {
  init();
  const htri_t r = H5Lexists(loc, name.c_str(), H5P_DEFAULT);
  if (r < 0) fail("H5Lexists " + name);
  return r > 0;
}

bool has_attr(hid_t obj, const std::string& name) {
  init();
  const htri_t r = H5Aexists(obj, name.c_str());
  if (r < 0) fail("H5Aexists " + name);
  return r > 0;
}

void write_attr(hid_t obj, const std::string& name, const std::string& value) {
  init();
  remove_attr_if_exists(obj, name);
  Handle type = vlen_string_type();
  Handle space = simple_space({});
  Handle a(check(H5Acreate2(obj, name.c_str(), type, space, H5P_DEFAULT, H5P_DEFAULT), "attribute " + name),
           H5Aclose);
  const char* p = value.c_str();
  check_status(H5Awrite(a, type, &p), "writing attribute " + name);
}

void write_attr(hid_t obj, const std::string& name, int64_t value) {
  init();
  remove_attr_if_exists(obj, name);
  Handle space = simple_space({});
  Handle a(check(H5Acreate2(obj, name.c_str(), H5T_STD_I64LE, space, H5P_DEFAULT, H5P_DEFAULT), "attribute " + name),
           H5Aclose);
  check_status(H5Awrite(a, H5T_NATIVE_INT64, &value), "writing attribute " + name);
}

void write_attr(hid_t obj, const std::string& name, double value) {
  init();
  remove_attr_if_exists(obj, name);
  Handle space = simple_space({});
  Handle a(check(H5Acreate2(obj, name.c_str(), H5T_IEEE_F64LE, space, H5P_DEFAULT, H5P_DEFAULT), "attribute " + name),
           H5Aclose);
  check_status(H5Awrite(a, H5T_NATIVE_DOUBLE, &value), "writing attribute " + name);
}

void write_attr(hid_t obj, const std::string& name, std::span<const double> values) {
  init();
  remove_attr_if_exists(obj, name);
  Handle space = simple_space({values.size()});
  Handle a(check(H5Acreate2(obj, name.c_str(), H5T_IEEE_F64LE, space, H5P_DEFAULT, H5P_DEFAULT), "attribute " + name),
           H5Aclose);
  check_status(H5Awrite(a, H5T_NATIVE_DOUBLE, values.data()), "writing attribute " + name);
}

std::string read_attr_string(hid_t obj, const std::string& name) {
  init();
  Handle a(check(H5Aopen(obj, name.c_str(), H5P_DEFAULT), "no attribute " + name), H5Aclose);
  Handle type(check(H5Aget_type(a), "H5Aget_type"), H5Tclose);
  if (H5Tget_class(type) != H5T_STRING) throw std::runtime_error(fmt::format("attribute {} is not a string", name));
  if (H5Tis_variable_str(type) > 0) {
    Handle mem = vlen_string_type();
    char* p = nullptr;
    check_status(H5Aread(a, mem, &p), "reading attribute " + name);
    std::string s = p ? p : "";
    H5free_memory(p);
    return s;
  }
  const std::size_t size = H5Tget_size(type);
  std::string s(size, '\0');
  Handle mem(check(H5Tcopy(H5T_C_S1), "H5Tcopy"), H5Tclose);
  check_status(H5Tset_size(mem, size), "H5Tset_size");
  check_status(H5Aread(a, mem, s.data()), "reading attribute " + name);
  s.resize(std::strlen(s.c_str()));
  return s;
}

int64_t read_attr_int(hid_t obj, const std::string& name) {
  init();
  Handle a(check(H5Aopen(obj, name.c_str(), H5P_DEFAULT), "no attribute " + name), H5Aclose);
  int64_t v = 0;
  check_status(H5Aread(a, H5T_NATIVE_INT64, &v), "reading attribute " + name);
  return v;
}

double read_attr_double(hid_t obj, const std::string& name) {
  init();
  Handle a(check(H5Aopen(obj, name.c_str(), H5P_DEFAULT), "no attribute " + name), H5Aclose);
  double v = 0;
  check_status(H5Aread(a, H5T_NATIVE_DOUBLE, &v), "reading attribute " + name);
  return v;
}

template <class T>
void write_dataset(hid_t loc, const std::string& name, const std::vector<hsize_t>& dims, const T* data,
                   const std::vector<hsize_t>& chunk) {
  init();
  Handle space = simple_space(dims);
  Handle dcpl = compressed_dcpl(dims, chunk);
  Handle d(check(H5Dcreate2(loc, name.c_str(), Types<T>::file(), space, H5P_DEFAULT, dcpl, H5P_DEFAULT),
                 "cannot create dataset " + name),
           H5Dclose);
  hsize_t n = 1;
  for (hsize_t x : dims) n *= x;
  if (n > 0) check_status(H5Dwrite(d, Types<T>::mem(), H5S_ALL, H5S_ALL, H5P_DEFAULT, data), "writing " + name);
}

template <class T>
std::vector<T> read_dataset(hid_t loc, const std::string& name, std::vector<hsize_t>* dims_out) {
  init();
  Handle d(check(H5Dopen2(loc, name.c_str(), H5P_DEFAULT), "no dataset " + name), H5Dclose);
  Handle space(check(H5Dget_space(d), "H5Dget_space"), H5Sclose);
  const int rank = H5Sget_simple_extent_ndims(space);
  if (rank < 0) fail("H5Sget_simple_extent_ndims");
  std::vector<hsize_t> dims(static_cast<std::size_t>(rank));
  if (rank > 0) H5Sget_simple_extent_dims(space, dims.data(), nullptr);
  hsize_t n = 1;
  for (hsize_t x : dims) n *= x;
  std::vector<T> v(n);
  if (n > 0) check_status(H5Dread(d, Types<T>::mem(), H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data()), "reading " + name);
  if (dims_out) *dims_out = dims;
  return v;
}

template void write_dataset<float>(hid_t, const std::string&, const std::vector<hsize_t>&, const float*,
                                   const std::vector<hsize_t>&);
template void write_dataset<double>(hid_t, const std::string&, const std::vector<hsize_t>&, const double*,
                                    const std::vector<hsize_t>&);
template void write_dataset<int32_t>(hid_t, const std::string&, const std::vector<hsize_t>&, const int32_t*,
                                     const std::vector<hsize_t>&);
template void write_dataset<int64_t>(hid_t, const std::string&, const std::vector<hsize_t>&, const int64_t*,
                                     const std::vector<hsize_t>&);
template std::vector<float> read_dataset<float>(hid_t, const std::string&, std::vector<hsize_t>*);
template std::vector<double> read_dataset<double>(hid_t, const std::string&, std::vector<hsize_t>*);
template std::vector<int32_t> read_dataset<int32_t>(hid_t, const std::string&, std::vector<hsize_t>*);
template std::vector<int64_t> read_dataset<int64_t>(hid_t, const std::string&, std::vector<hsize_t>*);

void write_strings(hid_t loc, const std::string& name, const std::vector<std::string>& values) {
  init();
  Handle type = vlen_string_type();
  Handle space = simple_space({values.size()});
  Handle d(check(H5Dcreate2(loc, name.c_str(), type, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT),
                 "cannot create dataset " + name),
           H5Dclose);
  std::vector<const char*> p;
  p.reserve(values.size());
  for (const auto& s : values) p.push_back(s.c_str());
  if (!p.empty()) check_status(H5Dwrite(d, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, p.data()), "writing " + name);
}

std::vector<std::string> read_strings(hid_t loc, const std::string& name) {
  init();
  Handle d(check(H5Dopen2(loc, name.c_str(), H5P_DEFAULT), "no dataset " + name), H5Dclose);
  Handle space(check(H5Dget_space(d), "H5Dget_space"), H5Sclose);
  const hssize_t n = H5Sget_simple_extent_npoints(space);
  if (n < 0) fail("H5Sget_simple_extent_npoints");
  Handle type = vlen_string_type();
  std::vector<char*> p(static_cast<std::size_t>(n), nullptr);
  if (n > 0) check_status(H5Dread(d, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, p.data()), "reading " + name);
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
                          "cannot create dataset " + name),
                    H5Dclose);
}

void RowWriter::write_row(hsize_t row, std::span<const float> values) {
  if (row >= rows_ || values.size() != cols_)
    throw std::invalid_argument(fmt::format("RowWriter: row {} of {} with {} values (expected {})", row, rows_,
                                            values.size(), cols_));
  if (cols_ == 0) return;
  const hsize_t start[2] = {row, 0}, count[2] = {1, cols_};
  check_status(H5Sselect_hyperslab(file_space_, H5S_SELECT_SET, start, nullptr, count, nullptr), "select row");
  Handle mem = simple_space({1, cols_});
  check_status(H5Dwrite(dataset_, H5T_NATIVE_FLOAT, mem, file_space_, H5P_DEFAULT, values.data()), "writing row");
}

std::vector<float> read_row(hid_t loc, const std::string& name, hsize_t row) {
  init();
  Handle d(check(H5Dopen2(loc, name.c_str(), H5P_DEFAULT), "no dataset " + name), H5Dclose);
  Handle space(check(H5Dget_space(d), "H5Dget_space"), H5Sclose);
  hsize_t dims[2] = {0, 0};
  if (H5Sget_simple_extent_ndims(space) != 2) throw std::runtime_error(fmt::format("dataset {} is not 2-D", name));
  H5Sget_simple_extent_dims(space, dims, nullptr);
  if (row >= dims[0]) throw std::out_of_range(fmt::format("dataset {}: row {} of {}", name, row, dims[0]));
  std::vector<float> v(dims[1]);
  if (dims[1] == 0) return v;
  const hsize_t start[2] = {row, 0}, count[2] = {1, dims[1]};
  check_status(H5Sselect_hyperslab(space, H5S_SELECT_SET, start, nullptr, count, nullptr), "select row");
  Handle mem = simple_space({1, dims[1]});
  check_status(H5Dread(d, H5T_NATIVE_FLOAT, mem, space, H5P_DEFAULT, v.data()), "reading " + name);
  return v;
}

}  // namespace h5

// ---- result files ----------------------------------------------------------------------------

std::string config_group_name(const std::string& policy) {
  std::string s = policy;
  for (char& c : s)
    if (c == '/') c = '|';
  if (s.empty() || s == ".") s = "_" + s;
  return s;
}

namespace {

using h5::Handle;

void write_stats_arrays(hid_t g, const std::vector<eval::KlStats>& st, std::size_t K) {
  const std::size_t B = st.size();
  std::vector<double> bmean(B * K), bsum(B * K), mean(B), top1(B), dp(B), pct(B * 4);
  std::vector<int64_t> bcount(B * K), pos(B), fin(B), nfp(B), rnf(B), nfv(B);
  for (std::size_t b = 0; b < B; ++b) {
    const auto m = st[b].bucket_mean();
    for (std::size_t k = 0; k < K; ++k) {
      bmean[b * K + k] = m[k];
      bsum[b * K + k] = st[b].bucket_sum[k];
      bcount[b * K + k] = st[b].bucket_count[k];
    }
    mean[b] = st[b].mean_kl();
    top1[b] = st[b].top1();
    dp[b] = st[b].mean_delta_p();
    for (int q = 0; q < 4; ++q) pct[b * 4 + static_cast<std::size_t>(q)] = st[b].pct.value[static_cast<std::size_t>(q)];
    pos[b] = st[b].positions;
    fin[b] = st[b].finite_positions;
    nfp[b] = st[b].nonfinite_positions;
    rnf[b] = st[b].ref_nonfinite_positions;
    nfv[b] = st[b].nonfinite_values;
  }
  const std::vector<hsize_t> bk{B, K}, b1{B}, b4{B, 4};
  h5::write_dataset(g, "bucket_mean", bk, bmean.data());
  h5::write_dataset(g, "bucket_sum", bk, bsum.data());
  h5::write_dataset(g, "bucket_count", bk, bcount.data());
  h5::write_dataset(g, "mean_kl", b1, mean.data());
  h5::write_dataset(g, "top1", b1, top1.data());
  h5::write_dataset(g, "delta_p", b1, dp.data());
  h5::write_dataset(g, "percentiles", b4, pct.data());
  {
    Handle d(H5Dopen2(g, "percentiles", H5P_DEFAULT), H5Dclose);
    const std::vector<double> levels(eval::Percentiles::kLevels.begin(), eval::Percentiles::kLevels.end());
    h5::write_attr(d, "levels", std::span<const double>(levels));
  }
  h5::write_dataset(g, "positions", b1, pos.data());
  h5::write_dataset(g, "finite_positions", b1, fin.data());
  h5::write_dataset(g, "nonfinite_positions", b1, nfp.data());
  h5::write_dataset(g, "ref_nonfinite_positions", b1, rnf.data());
  h5::write_dataset(g, "nonfinite_values", b1, nfv.data());
}

void write_stats_scalars(hid_t g, const eval::KlStats& s) {
  const std::size_t K = s.bucket_sum.size();
  const auto m = s.bucket_mean();
  h5::write_dataset(g, "bucket_mean", {K}, m.data());
  h5::write_dataset(g, "bucket_sum", {K}, s.bucket_sum.data());
  h5::write_dataset(g, "bucket_count", {K}, s.bucket_count.data());
  const double mean = s.mean_kl(), top1 = s.top1(), dp = s.mean_delta_p();
  h5::write_dataset(g, "mean_kl", {}, &mean);
  h5::write_dataset(g, "top1", {}, &top1);
  h5::write_dataset(g, "delta_p", {}, &dp);
  h5::write_dataset(g, "percentiles", {4}, s.pct.value.data());
  {
    Handle d(H5Dopen2(g, "percentiles", H5P_DEFAULT), H5Dclose);
    const std::vector<double> levels(eval::Percentiles::kLevels.begin(), eval::Percentiles::kLevels.end());
    h5::write_attr(d, "levels", std::span<const double>(levels));
  }
  h5::write_dataset(g, "positions", {}, &s.positions);
  h5::write_dataset(g, "finite_positions", {}, &s.finite_positions);
  h5::write_dataset(g, "nonfinite_positions", {}, &s.nonfinite_positions);
  h5::write_dataset(g, "ref_nonfinite_positions", {}, &s.ref_nonfinite_positions);
  h5::write_dataset(g, "nonfinite_values", {}, &s.nonfinite_values);
}

template <class T>
T read_scalar(hid_t g, const std::string& name) {
  const auto v = h5::read_dataset<T>(g, name);
  if (v.size() != 1) throw std::runtime_error(fmt::format("dataset {} is not a scalar", name));
  return v[0];
}

std::string attr_or_empty(hid_t obj, const std::string& name) {
  return h5::has_attr(obj, name) ? h5::read_attr_string(obj, name) : std::string();
}

std::string json_array(const std::vector<std::string>& v) {
  std::string s = "[";
  for (std::size_t i = 0; i < v.size(); ++i) {
    if (i) s += ", ";
    s += '"';
    for (char c : v[i]) {
      if (c == '"' || c == '\\') s += '\\';
      s += c;
    }
    s += '"';
  }
  return s + "]";
}

}  // namespace

ResultsWriter::ResultsWriter(std::string path, const ResultsMetadata& meta, const std::vector<ResultsBook>& books,
                             const std::vector<int64_t>& edges)
    : path_(std::move(path)), tmp_(temp_path_for(path_)), n_books_(books.size()), n_(meta.n_positions) {
  file_ = h5::create_file(tmp_);
  try {
    h5::write_attr(file_, "schema", std::string(kResultsSchema));
    h5::write_attr(file_, "schema_version", kResultsSchemaVersion);
    h5::write_attr(file_, "toolkit_version", meta.toolkit_version);
    h5::write_attr(file_, "git_commit", meta.git_commit);
    h5::write_attr(file_, "created", meta.created);
    h5::write_attr(file_, "command_line", meta.command_line);
    h5::write_attr(file_, "model_description", meta.model_description);
    h5::write_attr(file_, "model_hash", meta.model_hash);
    h5::write_attr(file_, "model_dir", meta.model_dir);
    h5::write_attr(file_, "text_dir", meta.text_dir);
    h5::write_attr(file_, "tokens_dir", meta.tokens_dir);
    h5::write_attr(file_, "tokenizer", meta.tokenizer);
    h5::write_attr(file_, "tokenization", meta.tokenization);
    h5::write_attr(file_, "reference_policy", meta.reference_policy);
    h5::write_attr(file_, "n_positions", meta.n_positions);
    h5::write_attr(file_, "n_books", static_cast<int64_t>(books.size()));
    h5::write_attr(file_, "toolkit_versions_used", json_array(meta.toolkit_versions_used));
    h5::write_attr(file_, "sweep", meta.sweep_json);

    h5::write_dataset(file_, "bucket_edges", {edges.size()}, edges.data());
    Handle g = h5::create_group(file_, "books");
    std::vector<std::string> names, sources, hashes;
    std::vector<int64_t> n_tokens;
    const auto width = static_cast<std::size_t>(meta.n_positions + 1);
    std::vector<int32_t> tokens(books.size() * width);
    for (std::size_t b = 0; b < books.size(); ++b) {
      names.push_back(books[b].name);
      sources.push_back(books[b].source);
      hashes.push_back(books[b].text_fnv1a64);
      n_tokens.push_back(books[b].n_tokens);
      if (books[b].tokens.size() != width)
        throw std::invalid_argument(fmt::format("ResultsWriter: book {} has {} tokens, expected N + 1 = {}",
                                                books[b].name, books[b].tokens.size(), width));
      std::copy(books[b].tokens.begin(), books[b].tokens.end(), tokens.begin() + static_cast<std::ptrdiff_t>(b * width));
    }
    h5::write_strings(g, "name", names);
    h5::write_strings(g, "source", sources);
    h5::write_strings(g, "text_fnv1a64", hashes);
    h5::write_dataset(g, "n_tokens", {n_tokens.size()}, n_tokens.data());
    h5::write_dataset(g, "tokens", {books.size(), width}, tokens.data(), {1, 65536});
    Handle c = h5::create_group(file_, "configs");
  } catch (...) {
    file_.reset();
    std::error_code ec;
    fs::remove(tmp_, ec);
    throw;
  }
}

ResultsWriter::~ResultsWriter() {
  if (!committed_) {
    file_.reset();
    std::error_code ec;
    fs::remove(tmp_, ec);
  }
}

void ResultsWriter::add_config(const ConfigAttributes& attrs, const std::vector<eval::KlStats>& per_book,
                               const eval::KlStats& aggregate,
                               const std::function<std::vector<float>(std::size_t)>& kl_row) {
  if (per_book.size() != n_books_)
    throw std::invalid_argument(fmt::format("ResultsWriter::add_config {}: {} per-book statistics for {} books",
                                            attrs.policy, per_book.size(), n_books_));
  Handle configs = h5::open_group(file_, "configs");
  Handle g = h5::create_group(configs, config_group_name(attrs.policy));
  config_names_.push_back(config_group_name(attrs.policy));
  h5::write_attr(g, "policy", attrs.policy);
  h5::write_attr(g, "config", attrs.config_json);
  h5::write_attr(g, "forward_seconds", attrs.forward_seconds);
  h5::write_attr(g, "kl_seconds", attrs.kl_seconds);
  h5::write_attr(g, "toolkit_version", attrs.toolkit_version);
  {
    h5::RowWriter w(g, "kl", n_books_, static_cast<hsize_t>(n_));
    for (std::size_t b = 0; b < n_books_; ++b) {
      const std::vector<float> row = kl_row(b);
      w.write_row(b, row);
    }
  }
  const std::size_t K = aggregate.bucket_sum.size();
  write_stats_arrays(g, per_book, K);
  Handle a = h5::create_group(g, "aggregate");
  write_stats_scalars(a, aggregate);
  h5::write_attr(g, "complete", int64_t{1});
}

void ResultsWriter::set_toolkit_versions_used(const std::vector<std::string>& versions) {
  h5::write_attr(file_, "toolkit_versions_used", json_array(versions));
}

void ResultsWriter::commit() {
  h5::write_strings(file_, "config_order", config_names_);
  h5::write_attr(file_, "complete", int64_t{1});
  if (H5Fflush(file_, H5F_SCOPE_GLOBAL) < 0) throw std::runtime_error("flushing " + tmp_ + " failed");
  file_.reset();
  commit_file(tmp_, path_);
  committed_ = true;
}

ResultsSummary read_results_summary(const std::string& path) {
  Handle f = h5::open_file(path);
  ResultsSummary s;
  if (!h5::has_attr(f, "schema"))
    throw std::runtime_error(fmt::format("{}: not a replayssm kl-sweep result file (no 'schema' attribute)", path));
  s.schema = h5::read_attr_string(f, "schema");
  if (s.schema != kResultsSchema)
    throw std::runtime_error(
        fmt::format("{}: not a replayssm kl-sweep result file (schema '{}', expected '{}')", path, s.schema, kResultsSchema));
  s.schema_version = h5::read_attr_int(f, "schema_version");
  if (s.schema_version != kResultsSchemaVersion)
    throw std::runtime_error(fmt::format("{}: result schema version {} (this build reads {})", path, s.schema_version,
                                         kResultsSchemaVersion));
  s.complete = h5::has_attr(f, "complete") && h5::read_attr_int(f, "complete") == 1;
  ResultsMetadata& m = s.meta;
  m.toolkit_version = attr_or_empty(f, "toolkit_version");
  m.git_commit = attr_or_empty(f, "git_commit");
  m.created = attr_or_empty(f, "created");
  m.command_line = attr_or_empty(f, "command_line");
  m.model_description = attr_or_empty(f, "model_description");
  m.model_hash = attr_or_empty(f, "model_hash");
  m.model_dir = attr_or_empty(f, "model_dir");
  m.text_dir = attr_or_empty(f, "text_dir");
  m.tokens_dir = attr_or_empty(f, "tokens_dir");
  m.tokenizer = attr_or_empty(f, "tokenizer");
  m.tokenization = attr_or_empty(f, "tokenization");
  m.reference_policy = attr_or_empty(f, "reference_policy");
  m.sweep_json = attr_or_empty(f, "sweep");
  m.n_positions = h5::read_attr_int(f, "n_positions");
  s.edges = h5::read_dataset<int64_t>(f, "bucket_edges");
  {
    Handle b = h5::open_group(f, "books");
    s.book_names = h5::read_strings(b, "name");
  }
  Handle configs = h5::open_group(f, "configs");
  // The sweep order; every group the file holds is listed (the writer adds them together).
  const std::vector<std::string> names = h5::read_strings(f, "config_order");
  for (const std::string& name : names) {
    Handle g = h5::open_group(configs, name);
    ConfigSummary c;
    c.group = name;
    c.policy = attr_or_empty(g, "policy");
    c.config_json = attr_or_empty(g, "config");
    c.complete = h5::has_attr(g, "complete") && h5::read_attr_int(g, "complete") == 1;
    Handle a = h5::open_group(g, "aggregate");
    eval::KlStats st(s.edges);
    st.bucket_sum = h5::read_dataset<double>(a, "bucket_sum");
    st.bucket_count = h5::read_dataset<int64_t>(a, "bucket_count");
    st.positions = read_scalar<int64_t>(a, "positions");
    st.finite_positions = read_scalar<int64_t>(a, "finite_positions");
    st.nonfinite_positions = read_scalar<int64_t>(a, "nonfinite_positions");
    st.ref_nonfinite_positions = read_scalar<int64_t>(a, "ref_nonfinite_positions");
    st.nonfinite_values = read_scalar<int64_t>(a, "nonfinite_values");
    const double mean = read_scalar<double>(a, "mean_kl"), top1 = read_scalar<double>(a, "top1"),
                 dp = read_scalar<double>(a, "delta_p");
    const auto fin = static_cast<double>(st.finite_positions);
    st.kl_sum = st.finite_positions ? mean * fin : 0.0;
    st.top1_agree = st.finite_positions ? static_cast<int64_t>(std::llround(top1 * fin)) : 0;
    st.delta_p_count = st.finite_positions;
    st.delta_p_sum = st.finite_positions ? dp * fin : 0.0;
    const auto pct = h5::read_dataset<double>(a, "percentiles");
    for (std::size_t q = 0; q < 4 && q < pct.size(); ++q) st.pct.value[q] = pct[q];
    c.aggregate = std::move(st);
    s.configs.push_back(std::move(c));
  }
  return s;
}

// ---- cells -----------------------------------------------------------------------------------

void write_cell(const std::string& path, const CellRecord& c) {
  const std::string tmp = temp_path_for(path);
  try {
    {
      Handle f = h5::create_file(tmp);
      h5::write_attr(f, "schema", std::string("replayssm-kl-sweep-cell"));
      h5::write_attr(f, "sweep_id", c.sweep_id);
      h5::write_attr(f, "policy", c.policy);
      h5::write_attr(f, "book", c.book);
      h5::write_attr(f, "config_index", c.config_index);
      h5::write_attr(f, "book_index", c.book_index);
      h5::write_attr(f, "forward_seconds", c.forward_seconds);
      h5::write_attr(f, "kl_seconds", c.kl_seconds);
      h5::write_attr(f, "toolkit_version", c.toolkit_version);
      const eval::KlStats& s = c.stats;
      h5::write_attr(f, "positions", s.positions);
      h5::write_attr(f, "finite_positions", s.finite_positions);
      h5::write_attr(f, "nonfinite_positions", s.nonfinite_positions);
      h5::write_attr(f, "ref_nonfinite_positions", s.ref_nonfinite_positions);
      h5::write_attr(f, "nonfinite_values", s.nonfinite_values);
      h5::write_attr(f, "top1_agree", s.top1_agree);
      h5::write_attr(f, "delta_p_count", s.delta_p_count);
      h5::write_attr(f, "kl_sum", s.kl_sum);
      h5::write_attr(f, "delta_p_sum", s.delta_p_sum);
      h5::write_dataset(f, "kl", {c.kl.size()}, c.kl.data(), {65536});
      h5::write_dataset(f, "edges", {s.edges.size()}, s.edges.data());
      h5::write_dataset(f, "bucket_sum", {s.bucket_sum.size()}, s.bucket_sum.data());
      h5::write_dataset(f, "bucket_count", {s.bucket_count.size()}, s.bucket_count.data());
      h5::write_dataset(f, "percentiles", {4}, s.pct.value.data());
      if (H5Fflush(f, H5F_SCOPE_GLOBAL) < 0) throw std::runtime_error("flushing " + tmp + " failed");
    }
    commit_file(tmp, path);
  } catch (...) {
    std::error_code ec;
    fs::remove(tmp, ec);
    throw;
  }
}

CellRecord read_cell(const std::string& path) {
  Handle f = h5::open_file(path);
  if (!h5::has_attr(f, "schema") || h5::read_attr_string(f, "schema") != "replayssm-kl-sweep-cell")
    throw std::runtime_error(fmt::format("{}: not a kl-sweep cell file", path));
  CellRecord c;
  c.sweep_id = h5::read_attr_string(f, "sweep_id");
  c.policy = h5::read_attr_string(f, "policy");
  c.book = h5::read_attr_string(f, "book");
  c.config_index = h5::read_attr_int(f, "config_index");
  c.book_index = h5::read_attr_int(f, "book_index");
  c.forward_seconds = h5::read_attr_double(f, "forward_seconds");
  c.kl_seconds = h5::read_attr_double(f, "kl_seconds");
  c.toolkit_version = h5::read_attr_string(f, "toolkit_version");
  eval::KlStats s(h5::read_dataset<int64_t>(f, "edges"));
  s.positions = h5::read_attr_int(f, "positions");
  s.finite_positions = h5::read_attr_int(f, "finite_positions");
  s.nonfinite_positions = h5::read_attr_int(f, "nonfinite_positions");
  s.ref_nonfinite_positions = h5::read_attr_int(f, "ref_nonfinite_positions");
  s.nonfinite_values = h5::read_attr_int(f, "nonfinite_values");
  s.top1_agree = h5::read_attr_int(f, "top1_agree");
  s.delta_p_count = h5::read_attr_int(f, "delta_p_count");
  s.kl_sum = h5::read_attr_double(f, "kl_sum");
  s.delta_p_sum = h5::read_attr_double(f, "delta_p_sum");
  s.bucket_sum = h5::read_dataset<double>(f, "bucket_sum");
  s.bucket_count = h5::read_dataset<int64_t>(f, "bucket_count");
  if (s.bucket_sum.size() + 1 != s.edges.size() || s.bucket_count.size() + 1 != s.edges.size())
    throw std::runtime_error(fmt::format("{}: bucket arrays do not match the edges", path));
  const auto pct = h5::read_dataset<double>(f, "percentiles");
  if (pct.size() != 4) throw std::runtime_error(fmt::format("{}: percentiles must hold 4 values", path));
  for (std::size_t q = 0; q < 4; ++q) s.pct.value[q] = pct[q];
  c.kl = h5::read_dataset<float>(f, "kl");
  c.stats = std::move(s);
  return c;
}

}  // namespace replayssm::io
