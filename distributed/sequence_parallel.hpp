// A graph run sequence-parallel over the ranks of a job: every value that carries the sequence
// holds only this rank's rows of it, attention runs as ring attention, and everything else runs
// on the rank's own backend on its rows. How a model written in the DSL runs over a sequence no
// one rank could hold, without rewriting it.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "backends/backend.hpp"
#include "distributed/communicator.hpp"
#include "distributed/ring_attention.hpp"
#include "ir/graph.hpp"

namespace qkv::distributed {

class SequenceParallel {
 public:
  /// Prepares `g` for sequence-parallel runs, the sequence being its named dims `sequence_dims`
  /// ("N", or "N" and "M" for attention whose queries and keys are the same sequence under two
  /// names). Attention patterns are fused first and means over the sequence decomposed into
  /// sums; then every node whose value is read must be local to each position (elementwise ops,
  /// matmuls and reductions over other axes, layout changes), a sum over the sequence (each
  /// rank's part, summed over the ranks), positions (iota along the sequence: each rank's rows'
  /// positions in the whole sequence) or attention over the sequence (fused, without a mask
  /// tensor, window or dropout, its modifier reading only the score and positions; k and v may
  /// have fewer heads than q). Throws UnsupportedError naming the first node that mixes
  /// positions otherwise (a maximum or softmax over the sequence, a slice of it, a value of its
  /// length), and its dims.
  SequenceParallel(Communicator& comm, backend::Backend& backend, const ir::Graph& g, std::vector<std::string> sequence_dims,
                   SequenceLayout layout = SequenceLayout::zigzag);
  ~SequenceParallel();

  /// Runs on this rank's shards of the inputs that carry the sequence (whole tensors for the
  /// others) and returns this rank's shards of the outputs.
  backend::TensorMap run_shards(const backend::TensorMap& shards);
  /// Runs on whole inputs (the same on every rank): shards them, runs, and gathers every output
  /// back to the whole sequence on every rank.
  backend::TensorMap run(const backend::TensorMap& inputs);

  /// The axis along which input or output `name` carries the sequence, or -1.
  int sequence_axis(const std::string& name) const;
  /// The graph after fusion, as analysed: what the stages and ring attentions compute.
  const ir::Graph& graph() const;
  /// How many backend executables (stages between attentions) and ring attentions a run makes.
  int stages() const;
  int ring_attentions() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// A backend that runs every graph it compiles sequence-parallel over the job, on `inner`: what
/// `qkv check` and `qkv bench` compare and time under mpirun. Its executables take whole inputs
/// and return whole outputs on every rank; they hold no state (training runs data-parallel).
std::unique_ptr<backend::Backend> sequence_parallel_backend(Communicator& comm, std::unique_ptr<backend::Backend> inner,
                                                            std::vector<std::string> sequence_dims, SequenceLayout layout = SequenceLayout::zigzag);

}  // namespace qkv::distributed
