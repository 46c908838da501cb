// Barrier levels over the kernels' byte ranges (see barriers.hpp).
#include "backends/vulkan/barriers.hpp"

#include <algorithm>

namespace qkv::backend {

namespace {

bool any_overlap(const std::vector<ByteRange>& a, const std::vector<ByteRange>& b) {
  return std::any_of(a.begin(), a.end(),
                     [&](const ByteRange& r) { return std::any_of(b.begin(), b.end(), [&](const ByteRange& s) { return r.overlaps(s); }); });
}

}  // namespace

std::vector<bool> barriers_before(const std::vector<KernelAccess>& kernels) {
  std::vector<bool> barrier(kernels.size(), false);
  std::vector<ByteRange> read, written;  // by the kernels of the current level
  for (std::size_t k = 0; k < kernels.size(); ++k) {
    const KernelAccess& a = kernels[k];
    if (any_overlap(a.reads, written) || any_overlap(a.writes, written) || any_overlap(a.writes, read)) {
      barrier[k] = true;
      read.clear();
      written.clear();
    }
    read.insert(read.end(), a.reads.begin(), a.reads.end());
    written.insert(written.end(), a.writes.begin(), a.writes.end());
  }
  return barrier;
}

}  // namespace qkv::backend
