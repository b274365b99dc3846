#include "dist/mpi_team.h"

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdlib>
#include <functional>
#include <iterator>
#include <stdexcept>
#include <thread>

#include <fmt/format.h>

namespace replayssm::dist {

namespace {

constexpr int kProgressTag = 0, kDoneTag = 1, kFirstReferenceTag = 2;
// MPI counts are int: a reference (N x hidden floats, 2^29 at 128K x 4096) goes in pieces.
constexpr std::size_t kPieceFloats = std::size_t{1} << 28;
constexpr double kReportInterval = 0.5;  // seconds between progress reports to rank 0
// Waiting is polling with sleeps, never MPI's busy wait: a waiting rank leaves its core to the others.
constexpr auto kWaitPoll = std::chrono::milliseconds(2);   // for a reference
constexpr auto kIdlePoll = std::chrono::milliseconds(20);  // rank 0 at the end, for the others

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

void check(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, text, &len);
  throw std::runtime_error(fmt::format("{}: {}", what, std::string(text, static_cast<std::size_t>(len))));
}

}  // namespace

// A send in flight: the requests and the data they read, kept alive until they complete.
struct MpiTeam::Pending {
  std::shared_ptr<const std::vector<float>> hidden;
  int64_t value = 0;  // a progress or done count
  std::vector<MPI_Request> requests;
};

std::unique_ptr<MpiTeam> MpiTeam::join() { return std::unique_ptr<MpiTeam>(new MpiTeam()); }

MpiTeam::MpiTeam() {
  // Open MPI's TCP transport moves a large message only while the sender is inside MPI, so a rank
  // waiting for a reference would wait for the sender's whole next forward (measured: 2-3 s per
  // reference at N = 4096 on the bundled Mamba-2, 0.01-0.07 s with this): its progress thread
  // moves it meanwhile. Read by Open MPI at MPI_Init; the user's own setting wins; other MPIs
  // ignore it.
  setenv("OMPI_MCA_btl_tcp_progress_thread", "1", /*overwrite=*/0);
  int provided = 0;
  check(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided), "MPI_Init_thread");
  // Errors come back as codes, turned into exceptions by check(); the CLI then aborts the job.
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  check(MPI_Comm_rank(MPI_COMM_WORLD, &rank_), "MPI_Comm_rank");
  check(MPI_Comm_size(MPI_COMM_WORLD, &size_), "MPI_Comm_size");
  MPI_Comm node = MPI_COMM_NULL;
  check(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node),
        "MPI_Comm_split_type");
  check(MPI_Comm_rank(node, &local_rank_), "MPI_Comm_rank (node)");
  check(MPI_Comm_size(node, &local_size_), "MPI_Comm_size (node)");
  MPI_Comm_free(&node);
  int* ub = nullptr;
  int flag = 0;
  MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &ub, &flag);
  if (flag && ub) tag_ub_ = *ub;
  progress_.assign(static_cast<std::size_t>(size_), 0);
}

MpiTeam::~MpiTeam() {
  if (!finalize_) return;
  // Normally empty by now (finish() waited); an exception path may leave sends that can no longer
  // be matched, and MPI_Finalize would wait for them: the CLI aborts instead in that case.
  MPI_Finalize();
}

std::string MpiTeam::library_version() const {
  char text[MPI_MAX_LIBRARY_VERSION_STRING];
  int len = 0;
  MPI_Get_library_version(text, &len);
  std::string s(text, static_cast<std::size_t>(len));
  return s.substr(0, s.find_first_of(",\n"));
}

void MpiTeam::abort(int exit_code) {
  finalize_ = false;
  MPI_Abort(MPI_COMM_WORLD, exit_code);
  std::_Exit(exit_code);  // MPI_Abort does not return; should it, this process still ends
}

int MpiTeam::reference_tag(std::size_t book) const {
  if (book > static_cast<std::size_t>(tag_ub_ - kFirstReferenceTag))
    throw std::runtime_error(fmt::format("book {}: more books than this MPI's message tags allow ({})", book, tag_ub_));
  return kFirstReferenceTag + static_cast<int>(book);
}

void MpiTeam::broadcast(std::string& bytes) {
  uint64_t n = bytes.size();
  check(MPI_Bcast(&n, 1, MPI_UINT64_T, 0, MPI_COMM_WORLD), "MPI_Bcast (length)");
  if (n > static_cast<uint64_t>(INT32_MAX)) throw std::runtime_error(fmt::format("broadcast of {} bytes", n));
  bytes.resize(n);
  check(MPI_Bcast(bytes.data(), static_cast<int>(n), MPI_CHAR, 0, MPI_COMM_WORLD), "MPI_Bcast");
}

void MpiTeam::send_reference(std::size_t book, std::shared_ptr<const std::vector<float>> hidden,
                             const std::vector<int>& to) {
  auto p = std::make_unique<Pending>();
  p->hidden = std::move(hidden);
  const int tag = reference_tag(book);
  const std::vector<float>& h = *p->hidden;
  for (int dest : to)
    for (std::size_t first = 0; first < h.size(); first += kPieceFloats) {
      const std::size_t n = std::min(kPieceFloats, h.size() - first);
      p->requests.emplace_back();
      check(MPI_Isend(h.data() + first, static_cast<int>(n), MPI_FLOAT, dest, tag, MPI_COMM_WORLD,
                      &p->requests.back()),
            "MPI_Isend (reference)");
    }
  pending_.push_back(std::move(p));
  poll();
}

std::vector<float> MpiTeam::receive_reference(std::size_t book, int from, std::size_t floats) {
  std::vector<float> out(floats);
  const int tag = reference_tag(book);
  std::vector<MPI_Request> requests;
  std::vector<std::size_t> sizes;
  for (std::size_t first = 0; first < floats; first += kPieceFloats) {
    sizes.push_back(std::min(kPieceFloats, floats - first));
    requests.emplace_back();
    check(MPI_Irecv(out.data() + first, static_cast<int>(sizes.back()), MPI_FLOAT, from, tag, MPI_COMM_WORLD,
                    &requests.back()),
          "MPI_Irecv (reference)");
  }
  // Polled with short sleeps: a blocking MPI_Recv spins a core, which a CPU sweep's other ranks
  // need.
  std::vector<MPI_Status> statuses(requests.size());
  for (int flag = 0; !flag;) {
    check(MPI_Testall(static_cast<int>(requests.size()), requests.data(), &flag, statuses.data()), "MPI_Testall");
    poll();
    if (!flag) std::this_thread::sleep_for(kWaitPoll);
  }
  for (std::size_t i = 0; i < requests.size(); ++i) {
    int got = 0;
    MPI_Get_count(&statuses[i], MPI_FLOAT, &got);
    if (static_cast<std::size_t>(got) != sizes[i])
      throw std::runtime_error(fmt::format("book {}: a piece of the reference from rank {} holds {} floats, expected {}",
                                           book, from, got, sizes[i]));
  }
  return out;
}

void MpiTeam::poll() {
  for (auto it = pending_.begin(); it != pending_.end();) {
    int flag = 0;
    check(MPI_Testall(static_cast<int>((*it)->requests.size()), (*it)->requests.data(), &flag, MPI_STATUSES_IGNORE),
          "MPI_Testall");
    it = flag ? pending_.erase(it) : std::next(it);
  }
}

void MpiTeam::report_progress(int64_t done) {
  poll();
  last_done_ = done;
  const double now = now_s();
  if (rank_ == 0 || now - last_report_ < kReportInterval) return;
  last_report_ = now;
  auto p = std::make_unique<Pending>();
  p->value = done;
  p->requests.emplace_back();
  check(MPI_Isend(&p->value, 1, MPI_INT64_T, 0, kProgressTag, MPI_COMM_WORLD, &p->requests.back()),
        "MPI_Isend (progress)");
  pending_.push_back(std::move(p));
}

int64_t MpiTeam::others_progress() {
  poll();
  if (rank_ != 0) return 0;
  while (true) {
    int flag = 0;
    MPI_Status status;
    check(MPI_Iprobe(MPI_ANY_SOURCE, kProgressTag, MPI_COMM_WORLD, &flag, &status), "MPI_Iprobe");
    if (!flag) break;
    int64_t v = 0;
    check(MPI_Recv(&v, 1, MPI_INT64_T, status.MPI_SOURCE, kProgressTag, MPI_COMM_WORLD, MPI_STATUS_IGNORE),
          "MPI_Recv (progress)");
    int64_t& latest = progress_[static_cast<std::size_t>(status.MPI_SOURCE)];
    latest = std::max(latest, v);
  }
  int64_t sum = 0;
  for (int r = 1; r < size_; ++r) sum += progress_[static_cast<std::size_t>(r)];
  return sum;
}

int64_t MpiTeam::finish(int64_t cells_run, const std::function<void()>& waiting) {
  if (rank_ != 0) {
    // The last count, then the references still in flight (their receivers may still be busy).
    last_report_ = -1e300;
    report_progress(last_done_);
    while (!pending_.empty()) {
      poll();
      if (!pending_.empty()) std::this_thread::sleep_for(kIdlePoll);
    }
    check(MPI_Send(&cells_run, 1, MPI_INT64_T, 0, kDoneTag, MPI_COMM_WORLD), "MPI_Send (done)");
    return cells_run;
  }
  int64_t total = cells_run;
  for (int finished = 1; finished < size_ || !pending_.empty();) {
    int flag = 0;
    MPI_Status status;
    check(MPI_Iprobe(MPI_ANY_SOURCE, kDoneTag, MPI_COMM_WORLD, &flag, &status), "MPI_Iprobe");
    if (flag) {
      int64_t v = 0;
      check(MPI_Recv(&v, 1, MPI_INT64_T, status.MPI_SOURCE, kDoneTag, MPI_COMM_WORLD, MPI_STATUS_IGNORE),
            "MPI_Recv (done)");
      total += v;
      ++finished;
      continue;
    }
    poll();
    if (waiting) waiting();
    std::this_thread::sleep_for(kIdlePoll);
  }
  if (waiting) waiting();  // the last progress counts, sent before each rank's done
  return total;
}

}  // namespace replayssm::dist
