// Expression nodes: what a DSL expression computes, with its shape and dtype checked at compile
// time by the registry's rules. A node's type is its shape and dtype; what it computes is a
// shared, immutable term (so no expression dangles, and a subexpression used twice is one term).
#pragma once

#include <array>
#include <concepts>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "dsl/dims.hpp"
#include "ir/op_rules.hpp"

namespace qkv::dsl {

/// Base of every expression type.
struct ExprBase {};

/// An expression type: derives from ExprBase, with a static `shape` (ir::Shape) and `dtype`.
template <class E>
concept Expr = std::is_base_of_v<ExprBase, E> && requires {
  { E::shape } -> std::convertible_to<ir::Shape>;
  { E::dtype } -> std::convertible_to<DType>;
};

namespace detail {
struct Term;
using TermPtr = std::shared_ptr<const Term>;

/// What an expression computes, at run time: one node of the DAG that lowering walks. The types
/// carry only what the compiler checks (shape and dtype), so an expression's type stays small
/// however deep the expression: children, attributes and names live here.
struct Term {
  enum class Kind : std::uint8_t { input, constant, node };
  Kind kind = Kind::node;
  ir::Op op{};                    // node
  ir::Attrs attrs{};              // node
  std::vector<TermPtr> children;  // node
  std::string_view name;          // input: a FixedString's, or owned_name
  std::string owned_name;         // input named at run time (param)
  DType dtype = DType::f32;       // input
  ir::Shape shape{};              // input, constant
  double value = 0.0;             // constant
  ir::Dim rsqrt_of = 0;           // constant: the value divided by sqrt(this dim's size) when bound
  /// Dims the node's shape or attributes name or derive, declared to the graph when lowered
  /// (template parameter objects, which live as long as the program).
  std::vector<const DimArg*> dims;

  Term() = default;
  Term(const Term&) = delete;
  Term& operator=(const Term&) = delete;
  /// Releases a chain of terms without recursion: an expression built in a loop may be a
  /// hundred thousand terms deep, more than the stack holds frames.
  ~Term() {
    std::vector<TermPtr> pending = std::move(children);
    while (!pending.empty()) {
      TermPtr t = std::move(pending.back());
      pending.pop_back();
      if (t.use_count() != 1) continue;  // still shared: released by its last owner
      // The last owner: take its children before it goes (terms are made non-const by make_shared).
      for (TermPtr& c : const_cast<Term&>(*t).children) pending.push_back(std::move(c));
    }
  }
};

template <DimArg... Ds> std::vector<const DimArg*> dim_decls(DimList<Ds...>) {
  std::vector<const DimArg*> decls;
  ((Ds.is_named() ? decls.push_back(&Ds) : void()), ...);
  return decls;
}

/// Out of line on purpose: a model builds hundreds of nodes, and inlining each node's
/// construction into one function is what made models slow to compile.
[[gnu::noinline]] inline TermPtr make_term(ir::Op op, const ir::Attrs& attrs, std::initializer_list<TermPtr> children,
                                           std::vector<const DimArg*> dims) {
  auto t = std::make_shared<Term>();
  t->op = op;
  t->attrs = attrs;
  t->children.assign(children.begin(), children.end());
  t->dims = std::move(dims);
  return t;
}
[[gnu::noinline]] inline TermPtr make_input_term(std::string_view name, DType dtype, const ir::Shape& shape, std::vector<const DimArg*> dims) {
  auto t = std::make_shared<Term>();
  t->kind = Term::Kind::input;
  t->name = name;
  t->dtype = dtype;
  t->shape = shape;
  t->dims = std::move(dims);
  return t;
}
/// An input whose name is made at run time (a checkpoint's parameter): the term keeps the name.
[[gnu::noinline]] inline TermPtr make_param_term(std::string name, DType dtype, const ir::Shape& shape, std::vector<const DimArg*> dims) {
  auto t = std::make_shared<Term>();
  t->kind = Term::Kind::input;
  t->owned_name = std::move(name);
  t->name = t->owned_name;
  t->dtype = dtype;
  t->shape = shape;
  t->dims = std::move(dims);
  return t;
}
[[gnu::noinline]] inline TermPtr make_constant_term(double value, const ir::Shape& shape, ir::Dim rsqrt_of, const DimArg* derived) {
  auto t = std::make_shared<Term>();
  t->kind = Term::Kind::constant;
  t->shape = shape;
  t->value = value;
  t->rsqrt_of = rsqrt_of;
  if (derived) t->dims.push_back(derived);
  return t;
}
}  // namespace detail

/// A named graph input. Name and dims are part of the type (a leaf: wrt() names inputs by type).
template <FixedString Name, DType DT, DimArg... Ds> struct Input : ExprBase {
  static constexpr ir::Shape shape = DimList<Ds...>::shape();  ///< The dims Ds: sizes and symbols.
  static constexpr DType dtype = DT;                           ///< The dtype DT.
  using dims = DimList<Ds...>;                                 ///< The dims, for lowering to declare their names.
  /// The input's name in the graph.
  static constexpr std::string_view name() { return Name.view(); }
  /// The leaf term lowering emits as the graph input `name()`.
  detail::TermPtr term() const { return detail::make_input_term(name(), DT, shape, detail::dim_decls(dims{})); }
  /// x[i] for an index a score or mask modifier gets: at(x, i) (dsl/score_mods.hpp).
  template <class I> auto operator[](I i) const { return at(*this, i); }
};

/// A tensor of a static shape filled with one value (a scalar by default); with `rsqrt_of` (a
/// named dim), the value divided by the square root of that dim's size when the graph is bound.
template <ir::Shape S = ir::Shape{}> struct Constant : ExprBase {
  static constexpr ir::Shape shape = S;       ///< The static shape S.
  static constexpr DType dtype = DType::f32;  ///< f32 (in arithmetic a scalar takes the other operand's dtype).
  double value = 0.0;                         ///< The value of every element.
  /// The named dim whose size's square root divides `value` when the graph is bound (0: none).
  ir::Dim rsqrt_of = 0;
  /// rsqrt_of when a builder derived it (D*D for 1/D): declared to the graph when lowered.
  const DimArg* rsqrt_of_derived = nullptr;
  /// The constant's term, which lowering emits as an ir::Graph constant.
  detail::TermPtr term() const { return detail::make_constant_term(value, S, rsqrt_of, rsqrt_of_derived); }
};

/// An op's result: its type is its shape and dtype, nothing else (what it was computed from is
/// in `term`), so equal shapes share one type and one instantiation of every builder.
template <ir::Shape S, DType DT> struct Node : ExprBase {
  static constexpr ir::Shape shape = S;  ///< The shape S, as the op's rule inferred it (or param()'s dims).
  static constexpr DType dtype = DT;     ///< The dtype DT, as the op's rule inferred it (or param()'s).
  /// What the node computes: its op, attributes and operands' terms (or param()'s input).
  detail::TermPtr term_;
  /// The node's term (shared: copies of a node are one term, lowered once).
  detail::TermPtr term() const { return term_; }
  /// x[i] for an index a score or mask modifier gets: at(x, i) (dsl/score_mods.hpp).
  template <class I> auto operator[](I i) const { return at(*this, i); }
};

namespace detail {
template <class... Cs> constexpr std::array<ir::Operand, sizeof...(Cs)> operands() { return {ir::Operand{Cs::shape, Cs::dtype}...}; }
template <ir::Op O, ir::Attrs A, class... Cs> constexpr ir::ShapeResult rule() {
  constexpr auto ops = operands<Cs...>();
  return ir::infer_shape(O, std::span<const ir::Operand>(ops.data(), ops.size()), A);
}
}  // namespace detail

/// Instantiated only when a rule fails: the compiler prints its template arguments (the op, the
/// error and the two dims involved) under the static assertion.
template <ir::Op O, ir::ShapeErr Error, ir::Dim Lhs, ir::Dim Rhs> struct shape_check {
  static_assert(Error == ir::ShapeErr::none, "qkv: shape or dtype error at this call; see shape_check<op, error, lhs, rhs> in the lines above");
  static constexpr bool ok = true;  ///< True: the check compiled (the rule held).
};

/// Builds a node whose attributes are known only at run time (a dropout probability) after
/// checking its shape rule, with the static attributes A, at the call site. `Names` lists the
/// dims its attributes name or derive (a DimList).
template <ir::Op O, ir::Attrs A = ir::Attrs{}, class Names = DimList<>, Expr... Cs>
auto make_node_with(const ir::Attrs& attrs, const Cs&... children) {
  constexpr ir::ShapeResult r = detail::rule<O, A, Cs...>();
  static_assert(shape_check<O, r.error, r.lhs, r.rhs>::ok);
  if constexpr (r.ok()) return Node<r.shape, r.dtype>{{}, detail::make_term(O, attrs, {children.term()...}, detail::dim_decls(Names{}))};
  else return ExprBase{};
}

/// Builds a node after checking its shape rule at the call site.
template <ir::Op O, ir::Attrs A = ir::Attrs{}, class Names = DimList<>, Expr... Cs> auto make_node(const Cs&... children) {
  return make_node_with<O, A, Names>(A, children...);
}

}  // namespace qkv::dsl
