// Flash-attention compute shaders: attention, its rows' log-sum-exp, its three gradients and its
// tangent (forward mode), each one dispatch that streams tiles of keys (or queries) through shared
// memory with an online softmax, so no score matrix is ever stored. Internal to codegen; glsl.cpp dispatches here.
#pragma once

#include <string>
#include <vector>

#include "codegen/glsl.hpp"
#include "codegen/push_constants.hpp"

namespace qkv::codegen::detail {

/// Whether the flash kernels take this attention node: its batch dims fit the push constants.
bool attention_fits(const ir::Node& n);
/// Whether the node's kernel is the flash forward, which binds a split buffer for decoding.
bool attention_splits_keys(const ir::Node& n);
/// Whether the node's kernel reads its row operands and writes its output through row and batch
/// strides (up to two batch dims), so head views and placed outputs can be given to it.
bool attention_strided(const ir::Node& n);
/// The push constants of the node's kernel, by name (codegen/push_constants.hpp).
PushConstants attention_push_constants(const ir::Node& n);
/// Which of a flash kernel's keys and values it reads from a paged cache through a block table
/// (ir::StorageKind::paged): bound as the pages, with the tables after the node's operands.
struct Paging {
  bool k = false, v = false;
};
/// The paged page_gather (ir::StorageKind::paged) that value x is, or is a reshape of; -1 otherwise.
ir::ValueId paged_gather(const ir::Graph& g, const ir::StoragePlan& storage, ir::ValueId x);
/// Which of node v's keys and values are paged.
Paging attention_paging(const ir::Graph& g, const ir::StoragePlan& storage, ir::ValueId v);
/// The values node v's kernel binds before its output: its operands, paged keys and values
/// replaced by their pages, then the block tables of the paged keys and of the paged values.
std::vector<ir::ValueId> attention_operands(const ir::Graph& g, const ir::StoragePlan& storage, ir::ValueId v);
/// The specialization constants of the node's kernel, by name (codegen/push_constants.hpp).
SpecConstants attention_spec_constants(const ir::Node& n, Paging paging = {});
/// Push-constant words the node's kernel needs.
int attention_push_words(const ir::Node& n);
/// The forward output a tangent's kernel also writes (codegen::forward_beside): whether it does,
/// the dtype its storage holds and the one it is rounded to as it is stored.
struct Beside {
  bool on = false;
  DType out = DType::f32, rounded = DType::f32;
};
/// `held`: the dtypes its operands' buffers hold, in operand order (q, k, v, dy and the sink
/// logits are read in them, f16 and bf16 widened where loaded; missing entries f32); `out`: the
/// dtype its output is written in (f16 or bf16 rounded to nearest even first).
/// `rounded`: f16 or bf16 where the output is stored rounded to it in f32 storage
/// (ir::ValueStorage::rounded). `cooperative`: the target whose cooperative matrices the
/// forward's kernel also uses (where attention_cooperative), its scalar path beside them for
/// head dims whose tiles do not fit. `paging`: the keys and values it reads through block tables.
/// `beside`: for a tangent, the forward's output it writes too, bound after its own. `packed`:
/// over packed sequences (packed_sequences), whose rows' online softmax takes its keys one at a
/// time, so that no tile boundary regroups a sequence's sums (batch invariance).
KernelSource attention_source(const ir::Node& n, const std::vector<DType>& held = {}, DType out = DType::f32, DType rounded = DType::f32,
                              const Target* cooperative = nullptr, Paging paging = {}, Beside beside = {}, bool packed = false);
/// Whether node n attends over packed sequences: its modifier holds a document mask
/// (ir::document_mask_tensors) of tensors that, by their static dims, do not vary along the keys
/// and along the queries.
bool packed_sequences(const ir::Graph& g, const ir::Node& n);
/// Whether node v is a flash-attention forward, its log-sum-exp or dv, whose operands multiplied
/// in fragments (q, k, and v or dy) are f16 values, on a target whose cooperative matrices
/// (Target::cooperative_matrix) its kernel can use: not over packed sequences where the target
/// is deterministic (Target::deterministic).
bool attention_cooperative(const ir::Graph& g, const ir::StoragePlan& storage, ir::ValueId v, const Target& target);
/// How node v's kernel divides its work at these shapes, in words (the forward's decode layout
/// and key split), or empty.
std::string attention_work_split(const ir::Graph& g, ir::ValueId v, const std::vector<ir::Shape>& shapes, const Target& target);
/// Push constants, specialization and workgroups of node v's kernel for these shapes: operands
/// `storage` gives as head views read through their permuted strides, an output placed into a
/// permute written through its strides.
KernelLaunch attention_launch(const ir::Graph& g, const ir::StoragePlan& storage, ir::ValueId v, const std::vector<ir::Shape>& shapes,
                              const Target& target);

}  // namespace qkv::codegen::detail
