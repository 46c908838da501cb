// The job's communicator: MPI_COMM_WORLD under an MPI launcher, otherwise a job of one.
#include "distributed/communicator.hpp"

#include <unistd.h>

#include <algorithm>
#include <climits>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <type_traits>
#include <utility>

#include "ir/error.hpp"

#if QKV_HAVE_MPI
#include <mpi.h>
#endif

namespace qkv::distributed {

namespace {

// MPI counts are ints: larger buffers go in chunks of this many elements.
constexpr std::size_t kChunk = std::size_t{1} << 30;

// What a rank prints when the launcher ends it because another rank failed (mpirun sends
// SIGTERM to the rest of the job): written from the signal handler, so prepared beforehand.
char g_ended[160];
std::size_t g_ended_length = 0;

extern "C" void on_ended_by_launcher(int sig) {
  [[maybe_unused]] const ssize_t n = write(STDERR_FILENO, g_ended, g_ended_length);
  std::signal(sig, SIG_DFL);
  std::raise(sig);
}

#if QKV_HAVE_MPI
void check(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(rc, text, &length);
  throw DistError(std::string("mpi: ") + what + " failed: " + std::string(text, static_cast<std::size_t>(length)));
}

void finalize_at_exit() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

/// Calls f(pointer offset, count) over `n` elements in chunks an int can count.
template <typename F> void in_chunks(std::size_t n, F f) {
  for (std::size_t at = 0; at < n; at += kChunk) f(at, static_cast<int>(std::min(kChunk, n - at)));
}
#endif

}  // namespace

bool built_with_mpi() { return QKV_HAVE_MPI != 0; }

bool launched_by_mpi() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MPI_LOCALNRANKS"})
    if (std::getenv(v)) return true;
  return false;
}

// ---- Pending ----

struct Pending::Impl {
#if QKV_HAVE_MPI
  std::vector<MPI_Request> requests;
#endif
};

Pending::Pending(Pending&& o) noexcept : impl_(std::exchange(o.impl_, nullptr)) {}
Pending& Pending::operator=(Pending&& o) noexcept {
  if (this != &o) {
    if (impl_) wait();
    impl_ = std::exchange(o.impl_, nullptr);
  }
  return *this;
}
Pending::~Pending() {
  if (!impl_) return;
  try {
    wait();
  } catch (const DistError& e) {
    std::fprintf(stderr, "qkv: %s\n", e.what());
  }
}

void Pending::wait() {
  if (!impl_) return;
  Impl* impl = std::exchange(impl_, nullptr);
#if QKV_HAVE_MPI
  const int rc = MPI_Waitall(static_cast<int>(impl->requests.size()), impl->requests.data(), MPI_STATUSES_IGNORE);
  delete impl;
  check(rc, "MPI_Waitall");
#else
  delete impl;
#endif
}

bool Pending::done() {
  if (!impl_) return true;
#if QKV_HAVE_MPI
  int flag = 0;
  check(MPI_Testall(static_cast<int>(impl_->requests.size()), impl_->requests.data(), &flag, MPI_STATUSES_IGNORE), "MPI_Testall");
  return flag != 0;
#else
  return true;
#endif
}

// ---- Communicator ----

Communicator& Communicator::world() {
  static Communicator c;
  return c;
}

Communicator::Communicator() {
#if QKV_HAVE_MPI
  if (launched_by_mpi()) {
    int provided = 0;
    // Funneled: only the thread that made the communicator calls MPI (the CPU backend's thread
    // pool never does).
    check(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided), "MPI_Init_thread");
    std::atexit(finalize_at_exit);
    check(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
    check(MPI_Comm_rank(MPI_COMM_WORLD, &rank_), "MPI_Comm_rank");
    check(MPI_Comm_size(MPI_COMM_WORLD, &size_), "MPI_Comm_size");
    mpi_ = true;
    const int n = std::snprintf(g_ended, sizeof g_ended, "qkv: %s: stopped, because another rank of the job failed (its message says why)\n",
                                describe().c_str());
    g_ended_length = static_cast<std::size_t>(std::clamp(n, 0, static_cast<int>(sizeof g_ended) - 1));
    std::signal(SIGTERM, on_ended_by_launcher);
  }
#endif
}

std::string Communicator::describe() const { return "rank " + std::to_string(rank_) + " of " + std::to_string(size_); }

namespace {
/// Sums `data` over the ranks in place (of a communicator started with MPI when `mpi`).
template <class T> void allreduce_sum_in_place(bool mpi, std::span<T> data) {
#if QKV_HAVE_MPI
  if (mpi)
    in_chunks(data.size(), [&](std::size_t at, int n) {
      check(MPI_Allreduce(MPI_IN_PLACE, data.data() + at, n, std::is_same_v<T, float> ? MPI_FLOAT : MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD),
            "MPI_Allreduce");
    });
#else
  (void)mpi;
  (void)data;
#endif
}
}  // namespace

void Communicator::allreduce_sum(std::span<float> data) { allreduce_sum_in_place(mpi_, data); }
void Communicator::allreduce_sum(std::span<double> data) { allreduce_sum_in_place(mpi_, data); }

Pending Communicator::start_allreduce_sum(std::span<float> data) {
  Pending p;
#if QKV_HAVE_MPI
  if (mpi_) {
    p.impl_ = new Pending::Impl;
    in_chunks(data.size(), [&](std::size_t at, int n) {
      MPI_Request r;
      check(MPI_Iallreduce(MPI_IN_PLACE, data.data() + at, n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD, &r), "MPI_Iallreduce");
      p.impl_->requests.push_back(r);
    });
  }
#else
  (void)data;
#endif
  return p;
}

void Communicator::broadcast(std::span<std::byte> data, int root) {
  if (root < 0 || root >= size_) throw DistError("broadcast from rank " + std::to_string(root) + ", but the job has " + std::to_string(size_));
#if QKV_HAVE_MPI
  if (mpi_)
    in_chunks(data.size(), [&](std::size_t at, int n) { check(MPI_Bcast(data.data() + at, n, MPI_BYTE, root, MPI_COMM_WORLD), "MPI_Bcast"); });
#else
  (void)data;
#endif
}

std::vector<std::string> Communicator::allgather(const std::string& s) {
#if QKV_HAVE_MPI
  if (mpi_) {
    if (s.size() > INT_MAX) throw DistError("allgather of a string of " + std::to_string(s.size()) + " bytes");
    const int length = static_cast<int>(s.size());
    std::vector<int> lengths(static_cast<std::size_t>(size_)), offsets(static_cast<std::size_t>(size_));
    check(MPI_Allgather(&length, 1, MPI_INT, lengths.data(), 1, MPI_INT, MPI_COMM_WORLD), "MPI_Allgather");
    std::exclusive_scan(lengths.begin(), lengths.end(), offsets.begin(), 0);
    std::string all(static_cast<std::size_t>(offsets.back() + lengths.back()), '\0');
    check(MPI_Allgatherv(s.data(), length, MPI_CHAR, all.data(), lengths.data(), offsets.data(), MPI_CHAR, MPI_COMM_WORLD), "MPI_Allgatherv");
    std::vector<std::string> r;
    for (std::size_t i = 0; i < lengths.size(); ++i)
      r.push_back(all.substr(static_cast<std::size_t>(offsets[i]), static_cast<std::size_t>(lengths[i])));
    return r;
  }
#endif
  return {s};
}

namespace {
void check_sendrecv(std::size_t send, int dest, std::size_t recv, int source, int size) {
  if (dest < 0 || dest >= size || source < 0 || source >= size)
    throw DistError("sendrecv between ranks " + std::to_string(dest) + " and " + std::to_string(source) + " of a job of " + std::to_string(size));
  if (send != recv) throw DistError("sendrecv of " + std::to_string(send) + " floats into a buffer of " + std::to_string(recv));
}
}  // namespace

Pending Communicator::start_sendrecv(std::span<const float> send, int dest, std::span<float> recv, int source) {
  check_sendrecv(send.size(), dest, recv.size(), source, size_);
  Pending p;
#if QKV_HAVE_MPI
  if (mpi_) {
    p.impl_ = new Pending::Impl;
    in_chunks(send.size(), [&](std::size_t at, int n) {
      MPI_Request r[2];
      check(MPI_Irecv(recv.data() + at, n, MPI_FLOAT, source, 1, MPI_COMM_WORLD, &r[0]), "MPI_Irecv");
      check(MPI_Isend(send.data() + at, n, MPI_FLOAT, dest, 1, MPI_COMM_WORLD, &r[1]), "MPI_Isend");
      p.impl_->requests.insert(p.impl_->requests.end(), r, r + 2);
    });
    return p;
  }
#endif
  std::copy(send.begin(), send.end(), recv.begin());
  return p;
}

std::vector<std::byte> Communicator::allgather(std::span<const std::byte> mine) {
  std::vector<std::byte> all(mine.size() * static_cast<std::size_t>(size_));
#if QKV_HAVE_MPI
  if (mpi_) {
    // Equal sizes are the contract; a rank that breaks it is named rather than corrupting memory.
    const std::vector<std::string> sizes = allgather(std::to_string(mine.size()));
    for (std::size_t r = 0; r < sizes.size(); ++r)
      if (sizes[r] != sizes.front())
        throw DistError("allgather: rank " + std::to_string(r) + " gives " + sizes[r] + " bytes, rank 0 " + sizes.front());
    // In chunks an int can count: chunk i of every rank, then the next chunk.
    for (std::size_t at = 0; at < mine.size(); at += kChunk) {
      const std::size_t n = std::min(kChunk, mine.size() - at);
      std::vector<std::byte> part(n * static_cast<std::size_t>(size_));
      check(MPI_Allgather(mine.data() + at, static_cast<int>(n), MPI_BYTE, part.data(), static_cast<int>(n), MPI_BYTE, MPI_COMM_WORLD),
            "MPI_Allgather");
      for (int r = 0; r < size_; ++r)
        std::copy(part.begin() + static_cast<std::ptrdiff_t>(n * static_cast<std::size_t>(r)),
                  part.begin() + static_cast<std::ptrdiff_t>(n * static_cast<std::size_t>(r + 1)),
                  all.begin() + static_cast<std::ptrdiff_t>(mine.size() * static_cast<std::size_t>(r) + at));
    }
    return all;
  }
#endif
  std::copy(mine.begin(), mine.end(), all.begin());
  return all;
}

void Communicator::sendrecv(std::span<const float> send, int dest, std::span<float> recv, int source) {
  check_sendrecv(send.size(), dest, recv.size(), source, size_);
#if QKV_HAVE_MPI
  if (mpi_) {
    in_chunks(send.size(), [&](std::size_t at, int n) {
      check(MPI_Sendrecv(send.data() + at, n, MPI_FLOAT, dest, 0, recv.data() + at, n, MPI_FLOAT, source, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE),
            "MPI_Sendrecv");
    });
    return;
  }
#endif
  std::copy(send.begin(), send.end(), recv.begin());  // a job of one: the ring is this rank
}

void Communicator::barrier() {
#if QKV_HAVE_MPI
  if (mpi_) check(MPI_Barrier(MPI_COMM_WORLD), "MPI_Barrier");
#endif
}

void Communicator::abort(int code, const std::string& message) {
  if (size_ > 1) std::fprintf(stderr, "qkv: %s: %s\n", describe().c_str(), message.c_str());
  else std::fprintf(stderr, "qkv: %s\n", message.c_str());
  std::fflush(nullptr);
#if QKV_HAVE_MPI
  if (mpi_) {
    std::signal(SIGTERM, SIG_DFL);  // this rank's failure is the message, not the launcher's signal
    MPI_Abort(MPI_COMM_WORLD, code);
  }
#endif
  std::_Exit(code);
}

}  // namespace qkv::distributed
