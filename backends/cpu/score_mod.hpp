// Flex attention's score modifier on the CPU: the region (ir/region.hpp) interpreted over rows
// of a score tile, one op at a time over the whole row so that each op is a vector loop.
#pragma once

#include <optional>
#include <utility>
#include <vector>

#include "backends/cpu/kernels.hpp"
#include "ir/graph.hpp"
#include "ir/region.hpp"

namespace qkv::backend::cpu {

class ScoreModifier {
 public:
  /// `region` over `tensors` (its t0, t1, ... as f32, broadcasting to the scores
  /// [batch..., N, M]). With `derivative`, apply_row also gives d mod / d score.
  ScoreModifier(const ir::Graph& region, bool derivative, std::vector<ConstView> tensors, const ir::Shape& batch, std::int64_t n, std::int64_t m);

  /// Tensor k's values at `data` from now on, laid out as the tensor it was built with: a
  /// modifier built once per plan serves every run (building one interprets and analyses the
  /// region, which a small graph's run would otherwise pay every time).
  void set_tensor_data(std::size_t k, const float* data) { tensors_[k].data = data; }

  /// Query i of batch entry b over keys [j0, j0 + cols): s[j] becomes mod(s[j], i, j0 + j, t...)
  /// and, when built with its derivative, dmod[j] = d mod / d score there. The masking
  /// conditions in `kept` (kept_conditions' bits, for a row of a tile they were found for) are
  /// not evaluated: each `where` on one is its kept branch, and what only they read is not
  /// computed.
  void apply_row(std::int64_t b, std::int64_t i, std::int64_t j0, std::int64_t cols, float* s, float* dmod, std::uint32_t kept = 0) const;

  /// Which masking conditions of the region (each `where` with a -inf branch) provably keep every
  /// score of the tile (interval arithmetic as masks_tile), bit c for condition c: in a tile
  /// inside a document, below a causal diagonal written as a mask_mod, within a padding length,
  /// all of them (keeps_all), and its rows run the modifier without its masks, as FlexAttention
  /// runs its full blocks; in a slice of one packed sequence that causality's diagonal crosses,
  /// the document's test is left out and causality's evaluated. Up to four conditions are left
  /// out one by one; a region with more leaves out all or none.
  std::uint32_t kept_conditions(std::int64_t b, std::int64_t i0, std::int64_t rows, std::int64_t j0, std::int64_t cols) const;
  /// Whether `kept` (kept_conditions) holds every masking condition of a region that has some.
  bool keeps_all(std::uint32_t kept) const { return !mask_conds_.empty() && kept == all_kept_; }

  bool has_derivative() const { return dmod_ >= 0; }

  /// The masking conditions (bits as kept_conditions') that are diagonals: `greater(x, y)` of a
  /// tensor laid out along the queries and one along the keys, keeping where it holds, whose
  /// where's -inf is the result (every where between it and the result on a masking condition,
  /// -inf its other branch). varlen's causality within each sequence and a sliding window's far edge are such
  /// conditions (a position minus its sequence's first, against the other's): the kernels cut
  /// each row at them (diagonal_spans) rather than evaluate them per score.
  std::uint32_t diagonal_conditions() const { return diagonal_bits_; }

  /// keep[2 r], keep[2 r + 1]: the keys [lo, hi) of keys [j0, j0 + cols) (offsets from j0) that
  /// query i0 + r of batch entry b keeps under the diagonal conditions, r < rows, when each
  /// condition's key tensor is free of NaN and does not decrease over the tile: a condition then
  /// keeps a prefix of the keys (the query's tensor the greater) or a suffix, found by binary
  /// search. False, and nothing written, otherwise or when the region has no diagonal.
  bool diagonal_spans(std::int64_t b, std::int64_t i0, std::int64_t rows, std::int64_t j0, std::int64_t cols, std::int64_t* keep) const;

  /// Whether the modifier drops every score of a tile (queries [i0, i0 + rows) by keys
  /// [j0, j0 + cols) of batch entry b) whatever the scores are: interval arithmetic over the
  /// region (ir::bound_region) from the tile's index ranges and its tensors' values there (those
  /// laid out along the queries or the keys; one varying along both is read as unknown). Block
  /// sparsity for masks written as expressions: document masks from ids, prefix-LM, padding
  /// from lengths, a mask_mod over q_idx and kv_idx. False when nothing can be proved.
  bool masks_tile(std::int64_t b, std::int64_t i0, std::int64_t rows, std::int64_t j0, std::int64_t cols) const;

  /// Whether the region may mask some score of the tile when the scores are finite (interval
  /// arithmetic as masks_tile, the score anywhere in float's range): false for a tile inside a
  /// document or below a causal diagonal written as a mask_mod, true for one a boundary
  /// crosses. Only what the kernels look inside a tile for, never what they skip by.
  bool may_mask_within(std::int64_t b, std::int64_t i0, std::int64_t rows, std::int64_t j0, std::int64_t cols) const;

  /// Whether masks_tile can ever be true (the region has a -inf branch).
  bool may_mask_tiles() const { return masks_; }

  /// A document mask's ids, batch entry b's: query i's at q[i * q_stride], key j's at
  /// k[j * k_stride] (see document_ids).
  struct DocumentIds {
    const float* q;
    std::int64_t q_stride;
    const float* k;
    std::int64_t k_stride;
  };
  /// The ids of a document mask in the region, when it has one: `equal(a, b)` of a tensor a laid
  /// out along the queries and a tensor b along the keys, neither read anywhere else, whose
  /// inequality makes the result -inf whatever the other inputs are (proved once by interval
  /// arithmetic with a and b held apart). varlen's sequence numbers and document_mask's ids are
  /// such a mask: a query keeps no key of another id, a NaN id's included.
  std::optional<DocumentIds> document_ids(std::int64_t b) const;

 private:
  /// One node of the program: an input (loaded per row), a constant or an elementwise op on
  /// earlier registers (one register per node).
  struct Step {
    ir::Op op;
    int a = -1, b = -1, c = -1;  // operand registers
    float value = 0;             // constants
    int input = -1;              // inputs: which (ir::kRegionScore, ...)
    int kept = -1;               // a where on a masking condition: the branch that keeps
    int cond = -1;               // and that condition's index in mask_conds_
    bool uniform = false;        // the same for every key of a row (computed once per row)
  };
  struct Operand {
    const float* data;
    Strides batch;          // element strides over the batch dims
    std::int64_t row, col;  // strides along the queries and the keys (0 where broadcast)
  };
  std::int64_t batch_offset(const Operand& t, std::int64_t b) const;
  /// The ranges of the region's inputs over the tile for scores in `score` (see masks_tile).
  const std::vector<ir::ValueRange>& tile_inputs(ir::ValueRange score, std::int64_t b, std::int64_t i0, std::int64_t rows, std::int64_t j0,
                                                 std::int64_t cols) const;
  /// The register step r reads as when the conditions in `kept` hold: r, or the kept branch its
  /// where takes.
  int kept_register(int r, std::uint32_t kept) const;
  /// live_'s entry for the conditions in `kept`.
  std::size_t live_slot(std::uint32_t kept) const { return mask_conds_.size() <= kMostPartial ? kept : kept == all_kept_ ? 1 : 0; }
  static constexpr std::size_t kMostPartial = 4;

  ir::Graph region_;
  ir::Graph program_;  // the region, or with its derivative: what steps_ run
  bool masks_ = false;
  /// The masking conditions: (register, whether it keeps where true). Empty when the region
  /// cannot mask, or when one condition masks on both sides (no kept form).
  std::vector<std::pair<ir::ValueId, bool>> mask_conds_;
  std::uint32_t all_kept_ = 0;           // every condition's bit
  std::vector<std::vector<char>> live_;  // by live_slot: the steps a result reads
  float softcap_ = 0;                    // > 0: the region is cap * tanh(score / cap), run as one vector pass
  std::vector<Step> steps_;
  std::vector<Operand> tensors_;
  ir::Shape batch_;
  int mod_ = -1, dmod_ = -1;     // result registers
  int doc_q_ = -1, doc_k_ = -1;  // the document mask's tensors (document_ids), or -1
  /// A diagonal condition: its tensors (indices into tensors_), and whether the query's tensor is
  /// the greater (the row keeps a prefix) or the key's (a suffix).
  struct Diagonal {
    int query, key;
    bool prefix;
  };
  std::vector<Diagonal> diagonals_;
  std::uint32_t diagonal_bits_ = 0;
  /// Finds the diagonal conditions (constructor's last step).
  void find_diagonals();
  /// Whether the result is -inf wherever masking condition c fails: the where on c is reached
  /// from the result through kept branches of wheres whose other branch is -inf.
  bool masks_result(int c) const;
};

}  // namespace qkv::backend::cpu
