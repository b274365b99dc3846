// The HDF5 RAII layer (io/hdf5.h): round trips through the C API, type checks on reading, errors
// that name the file and object, and new files that reach the disk only whole.
#include <doctest/doctest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>

#include "io/atomic_file.h"
#include "io/hdf5.h"
#include "test_util.h"

using namespace replayssm;
using namespace replayssm::io;
namespace fs = std::filesystem;

namespace {

fs::path fresh_dir(const std::string& name) { return replayssm::test::fresh_dir("h5_" + name); }

std::size_t entries(const fs::path& d) {
  return static_cast<std::size_t>(std::distance(fs::directory_iterator(d), fs::directory_iterator()));
}

}  // namespace

TEST_CASE("HDF5 wrappers round-trip attributes, datasets and strings through the C API") {
  const fs::path d = fresh_dir("wrap");
  const std::string path = (d / "a.h5").string();
  {
    h5::NewFile f(path);
    h5::write_attr(f, "s", std::string("héllo \"json\""));
    h5::write_attr(f, "i", int64_t{-42});
    h5::write_attr(f, "x", 2.5);
    h5::write_attr(f, "x", 3.5);  // rewriting replaces
    const std::vector<double> arr = {1, 2, 3};
    h5::write_attr(f, "arr", std::span<const double>(arr));
    h5::Handle g = h5::create_group(f, "g");
    const std::vector<float> fl = {1.5f, NAN, INFINITY, -0.0f, 3, 4};
    h5::write_dataset(g, "f", {2, 3}, fl.data(), {1, 3});
    const std::vector<int64_t> il = {1, 2, 3};
    h5::write_dataset(g, "i", {3}, il.data());
    const int32_t i32[2] = {7, -8};
    h5::write_dataset(g, "i32", {2}, i32);
    const double scalar = 0.25;
    h5::write_dataset(g, "scalar", {}, &scalar);
    h5::write_strings(g, "names", {"a", "", "split:nvfp4+rtn|fp32@16"});
    h5::RowWriter w(g, "rows", 3, 4);
    const std::vector<float> r1 = {1, 2, 3, 4};
    w.write_row(1, r1);
    CHECK_THROWS_AS(w.write_row(3, r1), std::invalid_argument);
    CHECK_THROWS_WITH(h5::create_group(f, "g"), doctest::Contains("a.h5: /g: cannot create group"));
    CHECK(entries(d) == 0);  // built in memory: nothing on disk before commit
    f.commit();
  }
  CHECK(entries(d) == 1);
  h5::Handle f = h5::open_file(path);
  CHECK(h5::read_attr_string(f, "s") == "héllo \"json\"");
  CHECK(h5::read_attr_int(f, "i") == -42);
  CHECK(h5::read_attr_double(f, "x") == 3.5);
  CHECK(h5::has_attr(f, "arr"));
  CHECK_FALSE(h5::has_attr(f, "nope"));
  CHECK(h5::has_link(f, "g"));
  CHECK(h5::has_link(f, "g/f"));
  CHECK_FALSE(h5::has_link(f, "h"));
  CHECK_FALSE(h5::has_link(f, "h/f"));  // a missing parent is no error
  h5::Handle g = h5::open_group(f, "g");
  std::vector<hsize_t> dims;
  const auto fl = h5::read_dataset<float>(g, "f", &dims);
  CHECK(dims == std::vector<hsize_t>{2, 3});
  CHECK(fl[0] == 1.5f);
  CHECK(std::isnan(fl[1]));
  CHECK(fl[2] == INFINITY);
  CHECK(std::signbit(fl[3]));
  CHECK(h5::read_dataset<double>(g, "f")[0] == 1.5);  // float32 widens exactly
  CHECK(h5::read_dataset<int64_t>(g, "i") == std::vector<int64_t>{1, 2, 3});
  CHECK(h5::read_dataset<int32_t>(g, "i32") == std::vector<int32_t>{7, -8});
  CHECK(h5::read_dataset<double>(g, "scalar", &dims) == std::vector<double>{0.25});
  CHECK(dims.empty());
  CHECK(h5::read_scalar<double>(g, "scalar") == 0.25);
  CHECK(h5::read_strings(g, "names") == std::vector<std::string>{"a", "", "split:nvfp4+rtn|fp32@16"});
  CHECK(h5::read_row(g, "rows", 1) == std::vector<float>{1, 2, 3, 4});
  CHECK(h5::read_row(g, "rows", 0) == std::vector<float>{0, 0, 0, 0});  // unwritten rows read as the fill value
  CHECK_THROWS_AS(h5::read_row(g, "rows", 3), std::out_of_range);

  // Errors name the file, the object and what was expected.
  CHECK_THROWS_WITH(h5::read_attr_string(f, "nope"), doctest::Contains((path + ": no attribute nope on /").c_str()));
  CHECK_THROWS_WITH(h5::read_dataset<float>(g, "nope"), doctest::Contains((path + ": no dataset /g/nope").c_str()));
  CHECK_THROWS_WITH(h5::open_group(f, "g/f"), doctest::Contains((path + ": /g/f: not a group").c_str()));
  CHECK_THROWS_WITH(h5::read_attr_string(f, "i"), doctest::Contains("attribute i is not a string"));
  // Reading would convert silently (truncate, round, clamp): the stored type must fit.
  CHECK_THROWS_WITH(h5::read_attr_int(f, "x"), doctest::Contains("attribute x holds float64, expected int64"));
  CHECK_THROWS_WITH(h5::read_attr_double(f, "s"), doctest::Contains("attribute s holds string, expected float64"));
  CHECK_THROWS_WITH(h5::read_attr_double(f, "arr"), doctest::Contains("holds several values, expected one"));
  CHECK_THROWS_WITH(h5::read_dataset<int64_t>(g, "f"), doctest::Contains((path + ": /g/f: dataset holds float32, expected int64").c_str()));
  CHECK_THROWS_WITH(h5::read_dataset<int32_t>(g, "i"), doctest::Contains("holds int64, expected int32"));
  CHECK_THROWS_WITH(h5::read_dataset<float>(g, "scalar"), doctest::Contains("holds float64, expected float32"));
  CHECK_THROWS_WITH(h5::read_strings(g, "i"), doctest::Contains("expected variable-length strings"));
  CHECK_THROWS_WITH(h5::read_scalar<int64_t>(g, "i"), doctest::Contains("holds 3 values, expected a scalar"));

  {
    std::ofstream(d / "text.h5") << "not hdf5";
  }
  CHECK_THROWS_WITH(h5::open_file((d / "text.h5").string()), doctest::Contains("text.h5: not an HDF5 file"));
  CHECK_THROWS_WITH(h5::open_file((d / "none.h5").string()), doctest::Contains("none.h5: no such file"));
  CHECK_THROWS_WITH(h5::open_file(d.string()), doctest::Contains("is a directory, expected an HDF5 file"));
  fs::remove_all(d);
}

TEST_CASE("new files reach the disk only whole, by the atomic-file rule") {
  CHECK(temp_path_for("/x/y/results.h5") == "/x/y/.results.h5.tmp-" + std::to_string(::getpid()));
  const fs::path d = fresh_dir("commit");
  const std::string path = (d / "r.h5").string();
  {
    h5::NewFile f(path);
    h5::write_attr(f, "v", int64_t{1});
    f.commit();
  }
  {
    h5::NewFile f(path);
    h5::write_attr(f, "v", int64_t{2});
    // destroyed without commit: the old file stays, nothing else appears
  }
  CHECK(entries(d) == 1);
  CHECK(h5::read_attr_int(h5::open_file(path), "v") == 1);
  {
    h5::NewFile f(path);
    h5::write_attr(f, "v", int64_t{3});
    f.commit();  // replaces
  }
  CHECK(entries(d) == 1);
  CHECK(h5::read_attr_int(h5::open_file(path), "v") == 3);
  // A commit that cannot write says which file and why, and leaves the old file and no temporary.
  fs::create_directory(d / (".r.h5.tmp-" + std::to_string(::getpid())));  // the temporary's name is taken
  {
    h5::NewFile f(path);
    h5::write_attr(f, "v", int64_t{4});
    CHECK_THROWS_WITH(f.commit(), doctest::Contains(("cannot write " + path).c_str()));
  }
  fs::remove(d / (".r.h5.tmp-" + std::to_string(::getpid())));
  CHECK(entries(d) == 1);
  CHECK(h5::read_attr_int(h5::open_file(path), "v") == 3);
  // A missing directory is an error naming the file (the caller creates directories).
  h5::NewFile orphan((d / "missing" / "x.h5").string());
  CHECK_THROWS_WITH(orphan.commit(), doctest::Contains(("cannot write " + (d / "missing" / "x.h5").string()).c_str()));
  fs::remove_all(d);
}
