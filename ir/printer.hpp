// The IR's text form (deterministic, parsed back by parse_graph) and its Graphviz drawing.
#pragma once

#include <string>
#include <string_view>

#include "ir/graph.hpp"

namespace qkv::ir {

/// A number for messages and IR text: integers without a fraction ("33554432"), others with up
/// to 17 significant digits, and inf, -inf, nan.
std::string format_number(double v);

/// The graph as text, one node per line; equal graphs print equal text.
std::string print(const Graph& g);
/// Parses print()'s text back into a verified graph. Throws IrError naming the line.
Graph parse_graph(std::string_view text);
/// Declares a dim written as IR text ("N", "3*E", "(E/4)*2") in `g` (names and the dims derived
/// from them) and returns it. Throws IrError for bad text.
Dim parse_dim(Graph& g, std::string_view text);
/// A Graphviz DOT drawing of the graph.
std::string to_dot(const Graph& g);
/// One node's attributes as printed inside braces ("" when it has none).
std::string print_attrs(const Graph& g, const Node& n);

}  // namespace qkv::ir
