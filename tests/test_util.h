// Shared helpers for the doctest suites.
#pragma once
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace replayssm::test {

// The repository root: $REPLAYSSM_SOURCE_DIR when set (binaries carried to another machine),
// else the source directory this build was configured from.
inline std::string source_path(const std::string& relative) {
  const char* env = std::getenv("REPLAYSSM_SOURCE_DIR");
  return std::string(env && *env ? env : REPLAYSSM_SOURCE_DIR) + "/" + relative;
}

// A suite that cannot run on this machine says why on stderr and exits 77 (ctest: SKIPPED).
[[noreturn]] inline void skip_suite(const std::string& why) {
  std::cerr << "SKIPPED: " << why << std::endl;
  std::exit(77);
}

// Fixed base seed, recorded in the log; each case derives its own so inputs are fresh per case.
inline constexpr uint64_t kBaseSeed = 20261130;

// A share of a long case's configurations: with REPLAYSSM_TEST_SHARD=i/N only those whose index n has n % N == i run,
// so that a slow tool (compute-sanitizer racecheck) can cover one case in N processes; unset, every configuration runs.
// Seeds (and split verification's generator of accepted lengths) stay tied to n, so a shard runs the inputs the whole
// case would. Bad values stop the suite.
struct TestShard {
  int index = 0, count = 1;
};
inline TestShard parse_test_shard(const char* text) {
  TestShard s;
  if (!text || !*text) return s;
  const std::string t(text);
  const auto slash = t.find('/');
  std::size_t used_i = 0, used_n = 0;
  try {
    if (slash != std::string::npos) {
      s.index = std::stoi(t.substr(0, slash), &used_i);
      s.count = std::stoi(t.substr(slash + 1), &used_n);
    }
  } catch (const std::exception&) {
    used_i = 0;
  }
  if (slash == std::string::npos || used_i != slash || used_n != t.size() - slash - 1 || s.count < 1 || s.index < 0 ||
      s.index >= s.count)
    throw std::invalid_argument("REPLAYSSM_TEST_SHARD: expected i/N with 0 <= i < N (e.g. 0/4), got '" + t + "'");
  return s;
}
inline bool in_test_shard(int n) {
  static const TestShard shard = [] {
    const TestShard s = parse_test_shard(std::getenv("REPLAYSSM_TEST_SHARD"));
    if (s.count > 1)
      std::cout << "REPLAYSSM_TEST_SHARD=" << s.index << "/" << s.count << ": the sharded cases run only their configurations n with n % "
                << s.count << " == " << s.index << std::endl;
    return s;
  }();
  return n % shard.count == shard.index;
}

// ---- errors and scratch directories ------------------------------------------------------------
// The message of the exception (of type E) that f throws; "(no error)" when it throws none.
template <class E = std::exception, class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  }
  return "(no error)";
}
inline bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// DIR/replayssm_test_TAG_PID under the system temp dir, emptied now and left afterwards (so that a
// failing test's files can be looked at).
inline std::filesystem::path fresh_dir(const std::string& tag) {
  const auto d = std::filesystem::temp_directory_path() / ("replayssm_test_" + tag + "_" + std::to_string(::getpid()));
  std::filesystem::remove_all(d);
  std::filesystem::create_directories(d);
  return d;
}

// A fresh directory that is removed with the object; each one of a process has its own number.
class TempDir {
 public:
  explicit TempDir(const std::string& tag = "tmp") {
    static int counter = 0;
    path_ = fresh_dir(tag + "_" + std::to_string(++counter));
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::filesystem::path& path() const { return path_; }
  std::string str(const std::string& sub = "") const { return sub.empty() ? path_.string() : (path_ / sub).string(); }
  std::string operator/(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

// ---- the comparison rule of every numeric test ---------------------------------------------------
// Element i of `got` matches `ref` when |got_i - ref_i| <= atol + rtol * |ref_i|. NaN on either side
// never matches; an infinity matches only the same infinity. Bit-exact paths compare with == instead.
struct Tolerance {
  double atol = 0.0, rtol = 0.0;
};

struct Closeness {
  std::string what;
  std::size_t count = 0, mismatches = 0;
  double max_abs = 0.0;     // max |got - ref| over the finite pairs
  double max_excess = 0.0;  // max |got - ref| / (atol + rtol |ref|): a match is <= 1
  std::vector<std::string> first;  // the first mismatches, with index, values and allowance
  bool ok() const { return count > 0 && mismatches == 0; }
  std::string report() const {
    std::ostringstream s;
    s << what << ": " << mismatches << " of " << count << " elements outside tolerance (max |d| " << max_abs
      << ", max |d|/allowed " << max_excess << ")";
    for (const auto& m : first) s << "\n  " << m;
    if (mismatches > first.size()) s << "\n  ...";
    return s.str();
  }
};

// got and ref: n elements each (any arithmetic types).
// The element rule of compare_close: NaN never matches, an infinity only itself, else |got - ref| <= atol + rtol |ref|.
inline bool within_tolerance(double got, double ref, Tolerance tol) {
  if (std::isnan(got) || std::isnan(ref)) return false;
  if (std::isinf(got) || std::isinf(ref)) return got == ref;
  return std::abs(got - ref) <= tol.atol + tol.rtol * std::abs(ref);
}

template <class G, class R>
Closeness compare_close(const G* got, const R* ref, std::size_t n, Tolerance tol, std::string what,
                        std::size_t max_listed = 10) {
  Closeness c;
  c.what = std::move(what);
  c.count = n;
  for (std::size_t i = 0; i < n; ++i) {
    const double g = static_cast<double>(got[i]), r = static_cast<double>(ref[i]);
    const double allowed = tol.atol + tol.rtol * std::abs(r);
    if (std::isfinite(g) && std::isfinite(r)) {
      const double d = std::abs(g - r);
      c.max_abs = std::max(c.max_abs, d);
      c.max_excess = std::max(c.max_excess, allowed > 0 ? d / allowed : (d > 0 ? INFINITY : 0.0));
    }
    if (!within_tolerance(g, r, tol)) {
      ++c.mismatches;
      if (c.first.size() < max_listed) {
        std::ostringstream m;
        m.precision(9);
        m << "[" << i << "] got " << g << ", ref " << r << ", |d| " << std::abs(g - r) << " > allowed " << allowed;
        c.first.push_back(m.str());
      }
    }
  }
  return c;
}
template <class G, class R>
Closeness compare_close(const std::vector<G>& got, const std::vector<R>& ref, Tolerance tol, std::string what) {
  if (got.size() != ref.size()) {
    Closeness c;
    c.what = what;
    c.count = std::max(got.size(), ref.size());
    c.mismatches = c.count;
    c.first.push_back("sizes differ: got " + std::to_string(got.size()) + ", ref " + std::to_string(ref.size()));
    return c;
  }
  return compare_close(got.data(), ref.data(), ref.size(), tol, std::move(what));
}
// Per-value-head outputs (ssm tests): the heads concatenated.
template <class G, class R>
Closeness compare_close(const std::vector<std::vector<G>>& got, const std::vector<std::vector<R>>& ref, Tolerance tol,
                        std::string what) {
  std::vector<double> g, r;
  for (const auto& x : got) g.insert(g.end(), x.begin(), x.end());
  for (const auto& x : ref) r.insert(r.end(), x.begin(), x.end());
  return compare_close(g, r, tol, std::move(what));
}

// Root mean square of the finite elements: the scale of "relative to the run's typical size"
// tolerances (atol = rtol * rms), for outputs whose individual elements may nearly cancel.
template <class R>
double rms(const R* ref, std::size_t n) {
  double s = 0;
  std::size_t k = 0;
  for (std::size_t i = 0; i < n; ++i)
    if (std::isfinite(static_cast<double>(ref[i]))) s += static_cast<double>(ref[i]) * ref[i], ++k;
  return k ? std::sqrt(s / static_cast<double>(k)) : 0.0;
}
template <class R>
double rms(const std::vector<std::vector<R>>& ref) {
  double s = 0;
  std::size_t k = 0;
  for (const auto& x : ref) {
    const double m = rms(x.data(), x.size());
    s += m * m * static_cast<double>(x.size()), k += x.size();
  }
  return k ? std::sqrt(s / static_cast<double>(k)) : 0.0;
}
// |d| <= rtol * (rms(ref) + |ref|): relative to each element and to the run's typical size.
template <class R>
Tolerance relative_to_rms(double rtol, const std::vector<std::vector<R>>& ref) {
  return {rtol * rms(ref), rtol};
}

}  // namespace replayssm::test

// In a doctest case: CHECK_CLOSE(compare_close(got, ref, tol, "what")) — fails with the report.
#define CHECK_CLOSE(closeness)                 \
  do {                                         \
    const auto& replayssm_closeness_ = (closeness); \
    INFO(replayssm_closeness_.report());       \
    CHECK(replayssm_closeness_.ok());          \
  } while (0)
