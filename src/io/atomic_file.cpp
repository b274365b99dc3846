#include "io/atomic_file.h"

#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>  // renameat2
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <ostream>
#include <sstream>
#include <stdexcept>

#include <fmt/format.h>

namespace replayssm::io {
namespace fs = std::filesystem;

// ---- temporaries registered for signal cleanup ---------------------------------------------------
namespace {

// A fixed table the signal handler can walk without allocating: a slot is published by setting
// `used` after its path is written, and retired by clearing `used` before the path is reused.
constexpr int kSlots = 64;
constexpr std::size_t kPathMax = 4096;
struct TempSlot {
  std::atomic<bool> used{false};
  char path[kPathMax] = {};
};
std::array<TempSlot, kSlots> g_slots;
std::mutex g_slots_mutex;

int register_temp(const std::string& path) {
  if (path.size() + 1 > kPathMax) return -1;
  std::lock_guard<std::mutex> lock(g_slots_mutex);
  for (int i = 0; i < kSlots; ++i) {
    if (!g_slots[i].used.load()) {
      std::memcpy(g_slots[i].path, path.c_str(), path.size() + 1);
      g_slots[i].used.store(true);
      return i;
    }
  }
  return -1;  // more live temporaries than slots: the C++ error paths still remove them
}
void unregister_temp(int slot) {
  if (slot < 0) return;
  std::lock_guard<std::mutex> lock(g_slots_mutex);
  g_slots[slot].used.store(false);
}

// Async-signal-safe: unlink() and write() only, no allocation.
void write_stderr(const char* text) {
  std::size_t n = 0;
  while (text[n] != '\0') ++n;
  if (::write(STDERR_FILENO, text, n) < 0) {
    // nothing more can be done inside a signal handler
  }
}

extern "C" void remove_temps_and_reraise(int sig) {
  const char* name = sig == SIGINT ? "SIGINT" : sig == SIGTERM ? "SIGTERM" : sig == SIGHUP ? "SIGHUP" : "a signal";
  write_stderr("replayssm: stopped by ");
  write_stderr(name);
  for (auto& s : g_slots) {
    if (s.used.load() && ::unlink(s.path) == 0) {
      write_stderr("; removed the unfinished output ");
      write_stderr(s.path);
    }
  }
  write_stderr("\n");
  std::signal(sig, SIG_DFL);
  std::raise(sig);
}

std::string errno_text(int err) {
  std::string hint;
  if (err == ENOSPC) hint = " (the disk is full)";
  if (err == EFBIG) hint = " (the file size limit was reached)";
  if (err == EDQUOT) hint = " (the disk quota is exhausted)";
  return std::strerror(err) + hint;
}

[[noreturn]] void fail_errno(const std::string& what, const std::string& path, int err) {
  throw std::runtime_error(fmt::format("{}: {}: {}", path, what, errno_text(err)));
}

// rename(2), or with replace_existing false one that never replaces: renameat2(RENAME_NOREPLACE),
// or link(2) + unlink(2) on filesystems without it. Returns 0 or the errno.
int rename_into_place(const std::string& tmp, const std::string& path, bool replace_existing) {
  if (replace_existing) return std::rename(tmp.c_str(), path.c_str()) == 0 ? 0 : errno;
  if (::renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, path.c_str(), RENAME_NOREPLACE) == 0) return 0;
  if (errno != EINVAL && errno != ENOSYS) return errno;
  if (::link(tmp.c_str(), path.c_str()) != 0) return errno;
  ::unlink(tmp.c_str());
  return 0;
}

std::string rename_error(const std::string& tmp, const std::string& path, int err) {
  if (err == EEXIST)
    return fmt::format("{}: already exists (it appeared while this run was writing): not replaced", path);
  if (err == EISDIR) return fmt::format("{}: is a directory, expected a file name to write", path);
  return fmt::format("cannot rename {} to {}: {}", tmp, path, errno_text(err));
}

std::string parent_dir(const std::string& path) { return fs::path(path).parent_path().string(); }

void fsync_path(const std::string& path, bool directory) {
  const int fd = ::open(path.empty() ? "." : path.c_str(), directory ? (O_RDONLY | O_DIRECTORY) : O_RDONLY);
  if (fd < 0) fail_errno("cannot open to sync", path, errno);
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  // Some filesystems refuse fsync on a directory (EINVAL); the rename itself has happened.
  if (rc != 0 && !directory) fail_errno("fsync failed", path, err);
}

bool pid_alive(long pid) {
  if (pid <= 0) return false;
  return ::kill(static_cast<pid_t>(pid), 0) == 0 || errno == EPERM;
}

}  // namespace

void install_temp_cleanup_handlers() {
  static std::once_flag once;
  std::call_once(once, [] {
    for (int sig : {SIGINT, SIGTERM, SIGHUP}) {
      struct sigaction sa {};
      sa.sa_handler = remove_temps_and_reraise;
      sigemptyset(&sa.sa_mask);
      sa.sa_flags = 0;
      ::sigaction(sig, &sa, nullptr);
    }
    std::signal(SIGXFSZ, SIG_IGN);  // write() then fails with EFBIG and the error path runs
  });
}

// ---- atomic files ------------------------------------------------------------------------------

std::string temp_path_for(const std::string& path) {
  const fs::path p(path);
  return (p.parent_path() / fmt::format(".{}.tmp-{}", p.filename().string(), static_cast<long>(::getpid()))).string();
}

void commit_file(const std::string& tmp, const std::string& path, bool replace_existing) {
  fsync_path(tmp, false);
  if (const int err = rename_into_place(tmp, path, replace_existing)) throw std::runtime_error(rename_error(tmp, path, err));
  fsync_path(parent_dir(path), true);
}

AtomicFile::AtomicFile(std::string path, bool replace_existing)
    : path_(std::move(path)), tmp_(temp_path_for(path_)), replace_existing_(replace_existing) {
  slot_ = register_temp(tmp_);
}

AtomicFile::~AtomicFile() {
  if (!committed_) discard();
  unregister_temp(slot_);
}

void AtomicFile::write(const void* data, std::size_t bytes) {
  if (committed_) throw std::logic_error(fmt::format("{}: write after commit", path_));
  if (fd_ < 0) {
    fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd_ < 0) fail_errno("cannot create the temporary file " + tmp_, path_, errno);
  }
  const auto* p = static_cast<const char*>(data);
  while (bytes > 0) {
    const ssize_t n = ::write(fd_, p, bytes);
    if (n < 0) {
      if (errno == EINTR) continue;
      fail_errno("cannot write the temporary file " + tmp_, path_, errno);
    }
    p += n;
    bytes -= static_cast<std::size_t>(n);
  }
}

void AtomicFile::sync() {
  if (synced_ || committed_) return;
  if (fd_ >= 0) {
    if (::fsync(fd_) != 0) fail_errno("cannot flush the temporary file " + tmp_, path_, errno);
    const int rc = ::close(fd_);
    fd_ = -1;
    if (rc != 0) fail_errno("cannot close the temporary file " + tmp_, path_, errno);
  } else {
    fsync_path(tmp_, false);  // written by another library (HDF5) under temp_path()
  }
  synced_ = true;
}

void AtomicFile::commit() {
  if (committed_) return;
  sync();
  if (const int err = rename_into_place(tmp_, path_, replace_existing_)) throw std::runtime_error(rename_error(tmp_, path_, err));
  committed_ = true;
  unregister_temp(slot_);
  slot_ = -1;
  fsync_path(parent_dir(path_), true);
}

void commit_together(const std::vector<AtomicFile*>& files) {
  for (AtomicFile* f : files) f->sync();
  sigset_t interrupts, previous;
  sigemptyset(&interrupts);
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) sigaddset(&interrupts, sig);
  ::pthread_sigmask(SIG_BLOCK, &interrupts, &previous);
  std::vector<AtomicFile*> done;
  for (AtomicFile* f : files) {
    if (f->committed_) continue;
    if (const int err = rename_into_place(f->tmp_, f->path_, f->replace_existing_)) {
      std::string removed, replaced;
      for (AtomicFile* d : done) {
        if (!d->replace_existing_ && ::unlink(d->path_.c_str()) == 0)
          removed += (removed.empty() ? "" : ", ") + d->path_;
        else
          replaced += (replaced.empty() ? "" : ", ") + d->path_;
      }
      ::pthread_sigmask(SIG_SETMASK, &previous, nullptr);
      throw std::runtime_error(fmt::format("{}{}{}", rename_error(f->tmp_, f->path_, err),
                                           removed.empty() ? "" : "; removed the outputs already written: " + removed,
                                           replaced.empty() ? "" : "; already replaced: " + replaced));
    }
    f->committed_ = true;
    done.push_back(f);
  }
  for (AtomicFile* f : done) {
    unregister_temp(f->slot_);
    f->slot_ = -1;
  }
  ::pthread_sigmask(SIG_SETMASK, &previous, nullptr);
  for (AtomicFile* f : done) fsync_path(parent_dir(f->path_), true);
}

void AtomicFile::discard() {
  if (fd_ >= 0) {
    ::close(fd_);
    fd_ = -1;
  }
  if (!committed_) ::unlink(tmp_.c_str());
}

void write_file_atomically(const std::string& path, const void* data, std::size_t bytes) {
  AtomicFile f(path);
  f.write(data, bytes);
  f.commit();
}

std::string read_file(const std::string& path) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) throw std::runtime_error(fmt::format("{}: is a directory, expected a file", path));
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error(fmt::format("{}: cannot open: {}", path, std::strerror(errno)));
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) throw std::runtime_error(fmt::format("{}: read error", path));
  return std::move(ss).str();
}

int remove_stale_temps(const std::string& dir, const std::string& name, std::ostream& log, std::string_view who) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return 0;
  int removed = 0;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string n = e.path().filename().string();
    // Exactly ".NAME.tmp-DIGITS": a prefix match would take the temporary of NAME.2 for NAME's.
    const std::size_t tag = n.rfind(".tmp-");
    if (n.size() < 2 || n[0] != '.' || tag == std::string::npos || tag < 2) continue;
    const std::string base = n.substr(1, tag - 1);
    const std::string digits = n.substr(tag + 5);
    if (digits.empty() || digits.size() > 9 || digits.find_first_not_of("0123456789") != std::string::npos) continue;
    if (!name.empty() && base != name) continue;
    if (pid_alive(std::stol(digits))) continue;
    if (fs::remove(e.path(), ec)) {
      ++removed;
      log << fmt::format("{}: removed {} (left by an interrupted run)\n", who, e.path().string());
    }
  }
  return removed;
}

// ---- locks -------------------------------------------------------------------------------------

FileLock::FileLock(std::string path, std::string_view who) : path_(std::move(path)) {
  for (int attempt = 0; attempt < 5; ++attempt) {
    fd_ = ::open(path_.c_str(), O_CREAT | O_RDWR | O_CLOEXEC, 0644);
    if (fd_ < 0) fail_errno("cannot create lock file", path_, errno);
    if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
      std::string holder;
      std::ifstream(path_) >> holder;
      ::close(fd_);
      fd_ = -1;
      throw std::runtime_error(fmt::format(
          "another {}{} is writing the same output (lock {} is held): wait for it to finish, or choose another "
          "output",
          who, holder.empty() ? "" : " (pid " + holder + ")", path_));
    }
    // The previous holder may have removed the file between our open and flock: retry then.
    struct stat a {}, b {};
    if (::fstat(fd_, &a) == 0 && ::stat(path_.c_str(), &b) == 0 && a.st_ino == b.st_ino && a.st_dev == b.st_dev) {
      const std::string pid = std::to_string(static_cast<long>(::getpid())) + "\n";
      if (::ftruncate(fd_, 0) == 0 && ::write(fd_, pid.data(), pid.size()) < 0) {
        // the pid is only informative
      }
      return;
    }
    ::close(fd_);
    fd_ = -1;
  }
  throw std::runtime_error(fmt::format("{}: could not acquire the lock", path_));
}

FileLock::~FileLock() {
  if (fd_ >= 0) {
    ::unlink(path_.c_str());
    ::close(fd_);
  }
}

}  // namespace replayssm::io
