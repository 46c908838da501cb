// The storage plan of the Vulkan kernels: which values the generated kernels read or write in
// place (views, values written into a later value's storage, 16-bit storage read and written
// where it lies), decided from what each kernel family can do. The executable, code generation
// and `qkv explain` read the plan (ir::StoragePlan); nothing re-derives it.
#pragma once

#include <cstdint>

#include "ir/graph.hpp"
#include "ir/storage_plan.hpp"

namespace qkv::codegen {

/// The storage plan of lowered graph `g` for the generated kernels, where storage ranges bind at
/// multiples of `view_alignment` bytes (a device's minStorageBufferOffsetAlignment, at least 16;
/// 0: no slice or concat lies in place). Per value:
/// - *reshape*, *slice*: a reshape, and a slice whose elements are contiguous in its operand
///   (every dim before the axis 1, those after it static) at an aligned byte offset, are views;
/// - *head_view*: a permute keeping the last dim last, whose every reader is a flash kernel
///   reading it as q, k, v or dy through row and batch strides and whose operand is laid out
///   contiguously ([B, N, H, D] projections read as [B, H, N, D] heads);
/// - *half_view*: the cast to f32 of an f16 or bf16 input whose every reader (a flash kernel's
///   q, k, v or dy, a matmul's A or B, an elementwise node, an axis reduction, or a paged
///   page_gather's pages, which its flash kernels read) widens the 16-bit values where it loads them;
/// - *placed*: the permute (keeping the last dim last) that is the only reader of a flash
///   kernel's non-result output, which its kernel writes through the permuted strides;
/// - *narrowed*: the cast to f16 or bf16 that is the only reader of a non-result flash forward,
///   matmul, elementwise or axis-reduction value, which that kernel stores rounded into the
///   cast's 16-bit storage;
/// - *exact_round*: a round of values already of its dtype (a half graph rounds every half op's
///   result), or of a flash, softmax or axis-reduction value whose kernel stores its values
///   rounded (`rounded`; not a kept-dim sum or max whose round has elementwise readers: fusion
///   may compute it inside them);
/// - *concat*: a concat whose operands are contiguous runs of it, each with storage of its own
///   written by a kernel, read by no other concat (the packed QKV gradients);
/// - *in_place*: a cache update writing its new rows into the cache it updates;
/// - *paged*: a page_gather that flash kernels alone read, as keys or values (through reshapes
///   keeping its rows and their width): they bind its pages and block table and find each row
///   through the table, so nothing is gathered.
/// Verified (ir::verify_storage) before it is returned.
/// `storage_buffers`: what one shader may bind (0: no limit), which the block tables of a paged
/// cache must fit beside a flash kernel's operands.
ir::StoragePlan plan_storage(const ir::Graph& g, std::int64_t view_alignment = 0, std::uint32_t storage_buffers = 0);

}  // namespace qkv::codegen
