// Which kernels of a recorded run need a barrier before them: a kernel waits only for the
// kernels whose memory it depends on (it reads what one of them writes, or writes what one of
// them reads or writes); independent kernels run between the same two barriers.
#pragma once

#include <cstdint>
#include <vector>

namespace qkv::backend {

/// A byte range of the arena: [begin, end).
struct ByteRange {
  std::int64_t begin = 0, end = 0;
  bool overlaps(const ByteRange& o) const { return begin < o.end && o.begin < end; }
};

/// What one kernel reads and writes.
struct KernelAccess {
  std::vector<ByteRange> reads;
  std::vector<ByteRange> writes;
};

/// barrier[k]: whether a barrier must precede kernel k, recorded in order. Greedy in order: the
/// kernels since the last barrier form one level, and kernel k opens a new level when it
/// conflicts with any of them (read after write, write after read, write after write).
std::vector<bool> barriers_before(const std::vector<KernelAccess>& kernels);

}  // namespace qkv::backend
