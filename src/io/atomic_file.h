// Atomic outputs and output locks: the one rule every file the toolkit writes follows.
//
// A file DIR/NAME is written to DIR/.NAME.tmp-PID, flushed and fsync()ed, then renamed over NAME
// and DIR is fsync()ed: a reader sees the old file or the new one, never a part. The temporary is
// removed when the write fails, when the writer is destroyed without commit(), and when the process
// is stopped by SIGINT, SIGTERM or SIGHUP (a handler unlinks every live temporary, then re-raises).
// SIGXFSZ (file size limit) is ignored once the handlers are installed, so an oversized write
// fails with EFBIG and takes the error path. A SIGKILLed writer leaves its temporary; the next run
// removes it with remove_stale_temps(), which matches the exact name and a dead PID only.
#pragma once
#include <cstddef>
#include <iosfwd>
#include <string>
#include <string_view>
#include <vector>

namespace replayssm::io {

// DIR/.NAME.tmp-PID for DIR/NAME.
std::string temp_path_for(const std::string& path);
// fsync(tmp), rename(tmp, path), fsync(DIR). Throws std::runtime_error naming both paths.
// replace_existing false: the rename refuses (atomically) when `path` exists, and tmp is kept.
void commit_file(const std::string& tmp, const std::string& path, bool replace_existing = true);

// Installs the SIGINT/SIGTERM/SIGHUP cleanup handlers and ignores SIGXFSZ (idempotent; the CLI
// calls it at start-up). Without it temporaries are still removed on every C++ error path.
void install_temp_cleanup_handlers();

// One atomic output. The temporary is registered for signal cleanup while it exists.
// replace_existing false: commit() refuses when the output exists by then (no clobbering even
// when another process created it after the caller's own check).
class AtomicFile {
 public:
  explicit AtomicFile(std::string path, bool replace_existing = true);
  ~AtomicFile();  // removes the temporary unless committed
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;
  const std::string& path() const { return path_; }
  const std::string& temp_path() const { return tmp_; }
  // Writes bytes to the temporary (created or appended); throws naming the file (ENOSPC, EFBIG...).
  void write(const void* data, std::size_t bytes);
  void write(std::string_view text) { write(text.data(), text.size()); }
  // Flushes the temporary to disk (fsync) and closes it if this object wrote it; idempotent. The
  // step of a commit that can fail for lack of space, so commit_together() runs it first for all.
  void sync();
  // sync(), then commit_file(tmp, path).
  void commit();
  bool committed() const { return committed_; }
  // Removes the temporary now (idempotent).
  void discard();

 private:
  std::string path_, tmp_;
  int fd_ = -1;
  int slot_ = -1;
  bool replace_existing_ = true, synced_ = false, committed_ = false;
  friend void commit_together(const std::vector<AtomicFile*>& files);
};

// Commits several outputs as one result: every temporary is synced first (so a full disk fails
// before any output is touched), then all are renamed with SIGINT/SIGTERM/SIGHUP held back, so an
// interrupt cannot leave some renamed and others not. If a rename still fails (an output that
// must not be replaced appeared meanwhile), the outputs this call had created are removed again
// and the error names them; replaced files cannot be restored, which the error then says.
void commit_together(const std::vector<AtomicFile*>& files);

// Writes the whole of `bytes` to `path` atomically.
void write_file_atomically(const std::string& path, const void* data, std::size_t bytes);
inline void write_file_atomically(const std::string& path, std::string_view text) {
  write_file_atomically(path, text.data(), text.size());
}
// Reads a whole file; throws naming it.
std::string read_file(const std::string& path);

// Removes DIR/.NAME.tmp-PID files (exactly that pattern, PID all digits) whose PID is not a live
// process, logging each to `log` with `who` as prefix. NAME empty: every .X.tmp-PID in DIR.
// Returns how many were removed.
int remove_stale_temps(const std::string& dir, const std::string& name, std::ostream& log, std::string_view who);

// An exclusive flock() on a lock file, held for the object's life and removed on release.
// Throws std::runtime_error when another process holds it ("another WHO is writing ...").
class FileLock {
 public:
  FileLock(std::string path, std::string_view who);
  ~FileLock();
  FileLock(const FileLock&) = delete;
  FileLock& operator=(const FileLock&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  int fd_ = -1;
};

}  // namespace replayssm::io
