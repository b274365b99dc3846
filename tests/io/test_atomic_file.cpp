#include <doctest/doctest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "io/atomic_file.h"
#include "test_util.h"

using namespace replayssm::io;
namespace fs = std::filesystem;

using replayssm::test::error_of;
using replayssm::test::contains;
using replayssm::test::TempDir;

namespace {

long dead_pid() {
  const pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  ::waitpid(child, nullptr, 0);
  return child;
}

void touch(const std::string& path, const std::string& text = "partial") { std::ofstream(path) << text; }
std::string contents(const std::string& path) {
  std::ifstream in(path);
  return std::string((std::istreambuf_iterator<char>(in)), {});
}

}  // namespace

TEST_CASE("remove_stale_temps removes exactly NAME's temporaries of dead processes") {
  TempDir d;
  const std::string pid = std::to_string(dead_pid()), me = std::to_string(::getpid());
  const std::string stale = d / (".px.h5.tmp-" + pid);
  const std::string other_output = d / (".px.h5.2.tmp-" + pid);  // px.h5.2's, not px.h5's
  const std::string live = d / (".px.h5.tmp-" + me);
  const std::string not_a_pid = d / ".px.h5.tmp-12x";
  for (const auto& p : {stale, other_output, live, not_a_pid}) touch(p);
  std::ostringstream log;
  CHECK(remove_stale_temps(d.path().string(), "px.h5", log, "test") == 1);
  CHECK_FALSE(fs::exists(stale));
  CHECK(fs::exists(other_output));
  CHECK(fs::exists(live));
  CHECK(fs::exists(not_a_pid));
  CHECK(log.str() == "test: removed " + stale + " (left by an interrupted run)\n");
  CHECK(remove_stale_temps(d.path().string(), "px.h5.2", log, "test") == 1);
  CHECK_FALSE(fs::exists(other_output));
}

TEST_CASE("AtomicFile discards on destruction, commit renames, no-replace refuses") {
  TempDir d;
  const std::string out = d / "r.npy";
  touch(out, "old");
  std::string tmp;
  {
    AtomicFile f(out);
    tmp = f.temp_path();
    CHECK(tmp == d / (".r.npy.tmp-" + std::to_string(::getpid())));
    f.write("new");
    CHECK(fs::exists(tmp));
  }
  CHECK_FALSE(fs::exists(tmp));
  CHECK(contents(out) == "old");
  {
    AtomicFile f(out);
    f.write("new");
    f.commit();
    CHECK(f.committed());
  }
  CHECK(contents(out) == "new");
  CHECK_FALSE(fs::exists(tmp));

  {
    AtomicFile f(out, /*replace_existing=*/false);
    f.write("newer");
    const std::string e = error_of([&] { f.commit(); });
    CHECK_MESSAGE(contains(e, out + ": already exists"), e);
  }
  CHECK(contents(out) == "new");
  CHECK_FALSE(fs::exists(tmp));
}

TEST_CASE("commit_together commits all outputs or removes the ones it created") {
  TempDir d;
  const std::string a = d / "a", b = d / "b", c = d / "c";
  {
    AtomicFile fa(a, false), fb(b, false);
    fa.write("A");
    fb.write("B");
    commit_together({&fa, &fb});
  }
  CHECK(contents(a) == "A");
  CHECK(contents(b) == "B");
  touch(c, "someone else's");  // appears after the caller's checks: the set must not half-commit
  {
    AtomicFile fa(d / "a2", false), fc(c, false);
    fa.write("A2");
    fc.write("C");
    const std::string e = error_of([&] { commit_together({&fa, &fc}); });
    CHECK_MESSAGE(contains(e, c + ": already exists"), e);
    CHECK_MESSAGE(contains(e, "removed the outputs already written: " + d / "a2"), e);
  }
  CHECK_FALSE(fs::exists(d / "a2"));
  CHECK(contents(c) == "someone else's");
  for (const auto& entry : fs::directory_iterator(d.path())) CHECK_FALSE(contains(entry.path().filename().string(), ".tmp-"));
}

TEST_CASE("AtomicFile errors name the output and the reason") {
  TempDir d;
  AtomicFile f(d / "missing_dir/o.npy");
  const std::string e = error_of([&] { f.write("x"); });
  CHECK_MESSAGE(contains(e, d / "missing_dir/o.npy: cannot create the temporary file"), e);
  CHECK_MESSAGE(contains(e, "No such file or directory"), e);
}
