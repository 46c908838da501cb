// Memory planning: offsets of every value's storage in one arena, reusing the storage of values
// that are no longer needed.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "ir/graph.hpp"

namespace qkv::ir {

struct MemoryPlan {
  /// Byte offset of each value's storage in the arena; -1 for values with no storage of their
  /// own (inputs read in place, and aliases).
  std::vector<std::int64_t> offset;
  /// The value whose storage each value reads: itself, or for a view (a reshape, or what the
  /// caller's `views` name) the value it aliases.
  std::vector<ValueId> storage_of;
  /// Where each value starts inside storage_of's storage, in bytes (0 but for offset views).
  std::vector<std::int64_t> view_offset;
  std::int64_t total_bytes = 0;
};

/// Plans storage for `g` run in node order. `bytes[v]` is the size of value v; `in_place(n)` says
/// a node needs no storage (an input read where the caller keeps it). Reshapes alias their
/// operand. Inputs live the whole run (they are written before it and may be held between runs),
/// outputs and update values to the end; every other storage is reused after its last reader.
/// Offsets are multiples of `alignment`.
/// `reads`, when given, says per node which values it reads when it runs, in place of its
/// operands (a backend that computes several nodes in one kernel: the kernel's node reads what
/// the kernel reads, and the nodes computed inside it read nothing and get no storage).
/// `views`, when given, says per value the byte offset at which it aliases its first operand's
/// storage, or -1 where it has storage of its own (a backend reading contiguous slices in
/// place); without it, reshapes alias their operand at 0 and nothing else does.
/// A later value whose storage a value is written into, at a byte offset (`into` -1: none).
struct Placement {
  ValueId into = -1;
  std::int64_t at = 0;
};

/// `placed`, when given, names per value a later value whose storage it is written into and
/// where (its kernel writes there: an attention's heads into the permute that reads them, a
/// concat's operands into the concat), possibly through several such values; that storage then
/// lives from the first value written into it.
MemoryPlan plan_memory(const Graph& g, const std::vector<std::int64_t>& bytes, const std::function<bool(const Node&)>& in_place,
                       std::int64_t alignment, const std::vector<std::vector<ValueId>>* reads = nullptr,
                       const std::vector<std::int64_t>* views = nullptr, const std::vector<Placement>* placed = nullptr);

}  // namespace qkv::ir
