// qkv::distributed: the processes of one job and the collectives that data-parallel training and
// distributed attention use. A job is MPI's world when this process was started by mpirun (or
// another MPI launcher) in a build with MPI (CMake option QKV_WITH_MPI); otherwise it is this
// process alone, where every collective is the identity, so code written for a job of P ranks
// runs unchanged in one process.
#pragma once

#include <cstddef>
#include <span>
#include <string>
#include <vector>

#include "ir/error.hpp"

namespace qkv::distributed {

/// Whether this build can run a job of more than one process.
bool built_with_mpi();

/// Whether this process was started by an MPI launcher (mpirun, mpiexec, srun): its environment
/// names a rank.
bool launched_by_mpi();

/// A non-blocking collective in flight: its buffer must stay alive and untouched until wait().
class Pending {
 public:
  Pending() = default;
  /// Takes over `o`'s collective; `o` is left with none.
  Pending(Pending&& o) noexcept;
  /// Waits for this one's collective, if any, then takes over `o`'s.
  Pending& operator=(Pending&& o) noexcept;
  Pending(const Pending&) = delete;
  Pending& operator=(const Pending&) = delete;
  ~Pending();  // waits, if wait() was not called
  /// Blocks until the collective completes on this rank.
  void wait();
  /// Whether a collective is in flight (or was, until wait()).
  bool active() const { return impl_ != nullptr; }
  /// Whether it has completed, without blocking (true when none was started).
  bool done();
  /// Lets MPI move the transfer along: without a progress thread, MPI moves a large message only
  /// inside its own calls, so work that a transfer should overlap calls this between its pieces.
  void progress() { (void)done(); }

 private:
  friend class Communicator;
  struct Impl;
  Impl* impl_ = nullptr;
};

/// The ranks of a job. Collectives must be called by every rank in the same order; any failure
/// of the MPI runtime throws DistError.
class Communicator {
 public:
  /// The job this process belongs to. The first call starts MPI when launched by mpirun (MPI is
  /// finalized at exit); a rank whose job is ended by another rank's failure prints which rank it
  /// is before it stops.
  static Communicator& world();

  int rank() const { return rank_; }  ///< this process's rank, 0 to size() - 1
  int size() const { return size_; }  ///< the number of ranks (1 without mpirun)
  /// "rank 1 of 4", for messages.
  std::string describe() const;

  /// Sums `data` elementwise over the ranks, in place. Every rank receives the same bits.
  void allreduce_sum(std::span<float> data);
  /// Sums `data` elementwise over the ranks, in place, in double precision.
  void allreduce_sum(std::span<double> data);
  /// The same, started without waiting: the sum is in `data` once the result's wait() returns.
  Pending start_allreduce_sum(std::span<float> data);
  /// Rank `root`'s bytes, on every rank.
  void broadcast(std::span<std::byte> data, int root = 0);
  /// Every rank's `s`, in rank order.
  std::vector<std::string> allgather(const std::string& s);
  /// Every rank's bytes, in rank order, one after another; every rank gives as many.
  std::vector<std::byte> allgather(std::span<const std::byte> mine);
  /// Sends `send` to rank `dest` while receiving `recv` from rank `source` (one step of a ring).
  void sendrecv(std::span<const float> send, int dest, std::span<float> recv, int source);
  /// The same, started without waiting: `recv` holds the block once the result's wait() returns
  /// (ring attention passes the next block while it computes on this one).
  Pending start_sendrecv(std::span<const float> send, int dest, std::span<float> recv, int source);
  /// Returns once every rank has called it.
  void barrier();
  /// Ends every rank of the job with exit status `code`, after printing `message` prefixed with
  /// this rank (MPI_Abort). In a job of one process, prints and exits.
  [[noreturn]] void abort(int code, const std::string& message);

 private:
  Communicator();
  int rank_ = 0;
  int size_ = 1;
  bool mpi_ = false;
};

}  // namespace qkv::distributed
