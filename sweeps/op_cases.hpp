// The cases the conformance and gradient tests sweep for each op in the registry (built into
// qkv_sweeps with the random graphs composed from them, not into qkv_ir).
#pragma once

#include <string>
#include <vector>

#include "ir/graph.hpp"

namespace qkv::ir {

/// How a case's input is filled. keep_first: a boolean mask, random but keeping the first entry
/// of its last dim, so that no attention row loses every key.
/// ids: i32 values in [-1, 6], some outside [0, 5) on purpose.
/// segments: sorted i32 document ids along the longest dim (three documents), its last entry -1
/// (padding: a query there sees no key, a key there is seen by none).
/// slots: distinct i32 values in [-1, 2 n + 2) for n elements (page_write's destinations: two
/// tokens never share one; -1 and the largest fall outside the pages).
enum class Fill { normal, positive, boolean, keep_first, ids, seed, segments, slots };  // seed: an i32 in [0, 1000)

struct CaseInput {
  std::vector<std::int64_t> shape;
  Fill fill = Fill::normal;
};

struct OpCase {
  std::string label;
  std::vector<CaseInput> inputs;  // one per operand, named x0, x1, ...
  Attrs attrs;
  std::shared_ptr<const Graph> region = nullptr;  // flex attention's score modifier
};

/// The cases of `op` (at least one for every op; see op_cases.cpp).
std::vector<OpCase> op_cases(Op op);

/// The dtype of inputs filled this way.
DType fill_dtype(Fill f);

/// A graph applying `op` to inputs x0.. of the case's shapes, with one output "out".
Graph case_graph(Op op, const OpCase& c);

}  // namespace qkv::ir
