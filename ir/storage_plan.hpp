// The storage plan of a lowered graph: for each value, the dtype its storage holds, whether it
// aliases another value's storage or is written into a later one, and which kernel writes it or
// why none does. A backend decides it from what its kernels can read and write in place (the
// cpu backend's and the Vulkan code generator's planners); its executable, its kernels' code,
// `qkv explain` and `qkv dump --storage` all read this one record.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "ir/graph.hpp"
#include "ir/passes/memory_plan.hpp"

namespace qkv::ir {

/// Where a value's elements live, and who writes them.
enum class StorageKind : std::uint8_t {
  kernel,       ///< storage of its own, written by its own kernel
  input,        ///< an input: the caller's values, uploaded or read where the caller keeps them
  in_place,     ///< a kernel of its own, writing into its operand's storage (a cache update)
  reshape,      ///< a view of its operand at byte 0: the same elements in other dims
  slice,        ///< a view of a contiguous run of its operand, `offset` bytes in
  head_view,    ///< a permute its readers read in place through permuted strides
  half_view,    ///< a cast to f32 of 16-bit values: its readers widen them where they load them
  exact_round,  ///< a round or cast of values already of its dtype: its operand's storage
  placed,       ///< a permute its operand's kernel writes through permuted strides
  narrowed,     ///< a round or 16-bit cast its operand's kernel writes, rounded as it stores
  concat,       ///< a concat whose operands' kernels write their results into it
  paged,        ///< a page_gather its attention kernels read through the block table: nothing gathered
};

/// "kernel", "input", "reshape", ...: the kind as `qkv dump --storage` prints it.
std::string_view storage_kind_name(StorageKind kind);

/// One value's storage.
struct ValueStorage {
  /// Where its elements live and who writes them.
  StorageKind kind = StorageKind::kernel;
  /// The dtype of the elements its storage holds: f16 or bf16 for 16-bit storage (a half
  /// input, a round's or a 16-bit cast's result, and what a kernel writes into those), f32 for
  /// the rest (bool and i32 values are held as floats).
  DType held = DType::f32;
  /// f16 or bf16 where its kernel rounds each value to that dtype before storing it (into f32
  /// storage: its round is then an exact_round view of it); f32 where it stores values as computed.
  DType rounded = DType::f32;
  /// The value whose storage a view reads, or whose kernel writes a placed or narrowed value
  /// (for a concat: its first operand); -1 for the rest.
  ValueId of = -1;
  /// Where a view's elements start in `of`'s storage, in bytes.
  std::int64_t offset = 0;
  /// The later value whose storage this value's kernel writes its result into, and where
  /// (`into` -1: its own storage).
  Placement into{};
  /// Whether every value of it is an f16 (bf16) number: it has that dtype, rounds to it, is the
  /// cast of such a value, or moves such values (a reshape, permute, slice, broadcast, concat,
  /// negation or select of them). Kernels may multiply such values in that precision exactly.
  bool f16_numbers = false;
  /// Likewise for bf16.
  bool bf16_numbers = false;

  /// Whether a kernel of its own computes it (a kernel or in-place update, not a view or input).
  bool has_kernel() const { return kind == StorageKind::kernel || kind == StorageKind::in_place; }
  /// Whether it reads another value's storage at `offset` rather than being written.
  bool is_view() const;
  /// Member by member.
  bool operator==(const ValueStorage&) const = default;
};

/// The storage of every value of one lowered graph, as one backend's kernels hold it.
struct StoragePlan {
  /// Per value, in node order.
  std::vector<ValueStorage> values;
  /// Slices and concat operands lie in place at multiples of this many bytes (a device's
  /// minStorageBufferOffsetAlignment); 0: none do.
  std::int64_t view_alignment = 0;

  /// Value v's storage.
  const ValueStorage& operator[](ValueId v) const { return values[static_cast<std::size_t>(v)]; }
  /// Whether a kernel of its own computes value v.
  bool has_kernel(ValueId v) const { return (*this)[v].has_kernel(); }
  /// The dtype value v's storage holds.
  DType held(ValueId v) const { return (*this)[v].held; }
  /// Per value, the byte offset at which it aliases its first operand's storage (a view or an
  /// in-place update), -1 elsewhere: plan_memory's `views`.
  std::vector<std::int64_t> memory_views() const;
  /// Per value, the later value its kernel writes into: plan_memory's `placed`.
  std::vector<Placement> memory_placements() const;
};

/// The plan every backend starts from: inputs are the caller's, reshapes views of their
/// operands, every other value has a kernel; half-typed values are held in 16 bits.
StoragePlan plain_storage_plan(const Graph& g);

/// Whether page_gather v's readers are all attention kernels that take it as their keys or values
/// (directly or through reshapes), so that they may read the pages through the block table
/// instead of a gathered copy (StorageKind::paged); it is no result of the graph.
bool read_as_keys_or_values(const Graph& g, ValueId v);

/// Why value v has no kernel of its own, in words ("view of %3 at byte 4096", "written in place
/// by %7's kernel, rounded to bf16"), for every value that has none; empty for the rest. What
/// `qkv explain` and `qkv dump --glsl` print.
std::string no_kernel_reason(const Graph& g, const StoragePlan& plan, ValueId v);

/// The plan in text, one line per value: "%5 = slice : f32[32,32]  held f32  no kernel: view of %3 at
/// byte 4096".
std::string print_storage(const Graph& g, const StoragePlan& plan);

/// Checks the plan's own consistency: views read earlier values, placements name later values
/// that say who writes them, and kinds agree with their ops. Throws IrError naming the value.
void verify_storage(const Graph& g, const StoragePlan& plan);

}  // namespace qkv::ir
