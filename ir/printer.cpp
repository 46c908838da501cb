// Printing, parsing and drawing of graphs.
#include "ir/printer.hpp"

#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <limits>
#include <optional>

#include "ir/error.hpp"
#include "ir/region.hpp"
#include "ir/verifier.hpp"

namespace qkv::ir {

namespace {}  // namespace

std::string format_number(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

namespace {

std::string format_double(double v) { return format_number(v); }

std::string format_dims(const Graph& g, const Shape& s) {
  std::string r = "[";
  for (int i = 0; i < s.rank; ++i) r += (i ? "," : "") + g.dim_name(s[i]);
  return r + "]";
}

constexpr std::string_view align_name(CausalAlign a) {
  switch (a) {
    case CausalAlign::top_left: return "top_left";
    case CausalAlign::bottom_right: return "bottom_right";
  }
  return "?";
}

}  // namespace

namespace {

/// One attribute's value as IR text, by its kind (QKV_ATTRS).
std::string text_axis(const Graph&, const Node&, int v) { return std::to_string(v); }
std::string text_size(const Graph&, const Node&, std::int64_t v) { return std::to_string(v); }
std::string text_operand(const Graph&, const Node&, std::int8_t v) { return std::to_string(v); }
std::string text_boolean(const Graph&, const Node&, bool v) { return v ? "true" : "false"; }
std::string text_number(const Graph&, const Node&, double v) { return format_double(v); }
std::string text_dim(const Graph& g, const Node&, Dim v) { return g.dim_name(v); }
std::string text_shape(const Graph& g, const Node&, const Shape& v) { return format_dims(g, v); }
std::string text_align(const Graph&, const Node&, CausalAlign v) { return std::string(align_name(v)); }
std::string text_result_dtype(const Graph&, const Node&, DType v) { return std::string(dtype_name(v)); }
std::string text_perm(const Graph&, const Node& n, const Perm& v) {  // over the result's rank
  std::string p = "[";
  for (int i = 0; i < n.shape.rank; ++i) p += (i ? "," : "") + std::to_string(v[static_cast<std::size_t>(i)]);
  return p + "]";
}

}  // namespace

std::string print_attrs(const Graph& g, const Node& n) {
  const std::uint32_t flags = op_info(n.op).attrs;
  const Attrs defaults;
  std::string s;
  auto add = [&](const char* name, const std::string& text) { s += (s.empty() ? "" : ", ") + std::string(name) + "=" + text; };
#define QKV_PRINT_ATTR(field, type, init, flag, print, kind)                                                                   \
  if ((flags & flag) && AttrPrint::print != AttrPrint::never && !(n.op == Op::input && std::string_view(#field) == "shape") && \
      (AttrPrint::print == AttrPrint::always || !attr_equal(n.attrs.field, defaults.field)))                                   \
    add(#field, text_##kind(g, n, n.attrs.field));
  QKV_ATTRS(QKV_PRINT_ATTR)
#undef QKV_PRINT_ATTR
  return s;
}

namespace {

/// print() with every line after the first indented by `indent` more spaces (nested regions).
std::string print_indented(const Graph& g, const std::string& indent) {
  std::string out = "graph {\n";
  for (std::size_t i = 0; i < g.size(); ++i) {
    const Node& n = g.nodes()[i];
    out += indent + "  %" + std::to_string(i) + " = " + std::string(op_name(n.op));
    if (n.op == Op::input) out += " \"" + n.name + "\"";
    if (!n.inputs.empty()) {
      out += "(";
      for (std::size_t j = 0; j < n.inputs.size(); ++j) out += (j ? ", %" : "%") + std::to_string(n.inputs[j]);
      out += ")";
    }
    if (std::string attrs = print_attrs(g, n); !attrs.empty()) out += " {" + attrs + "}";
    out += " : " + g.type_string(i);
    if (n.region) out += " " + print_indented(*n.region, indent + "  ");  // the score modifier
    out += "\n";
  }
  if (!g.updates().empty()) {
    out += indent + "  update";
    for (std::size_t i = 0; i < g.updates().size(); ++i)
      out += (i ? ", " : " ") + g.updates()[i].first + "=%" + std::to_string(g.updates()[i].second);
    out += "\n";
  }
  out += indent + "  return";
  for (std::size_t i = 0; i < g.outputs().size(); ++i) out += (i ? ", " : " ") + g.outputs()[i].first + "=%" + std::to_string(g.outputs()[i].second);
  return out + "\n" + indent + "}";
}

}  // namespace

std::string print(const Graph& g) { return print_indented(g, "") + "\n"; }

namespace {

/// The largest static dim the text parser accepts (2^40): sizes beyond it cannot be allocated,
/// and sums and products of such dims stay far from overflow.
constexpr std::int64_t kMaxParsedDim = std::int64_t{1} << 40;

/// The most sizes, names and parentheses a derived dim ("A+B+...", "3*E", "(E/4)*2") may have.
constexpr int kMaxDimParts = 64;

class Parser {
 public:
  explicit Parser(std::string_view text, std::size_t pos = 0) : text_(text), pos_(pos) {}
  /// A parser of dims alone, declaring them in `g`.
  Parser(std::string_view text, Graph& g) : text_(text), g_(g) {}

  /// The whole text as one dim.
  Dim parse_dim_only() {
    const Dim d = dim();
    skip_space();
    if (pos_ != text_.size()) fail("text after the dim");
    return d;
  }

  Graph parse() {
    parse_body();
    skip_space();
    if (pos_ != text_.size()) fail("text after the closing brace");
    verify(g_);
    return std::move(g_);
  }

 private:
  /// "graph { ... }" from the current position, unverified.
  void parse_body() {
    expect_word("graph");
    expect('{');
    while (true) {
      skip_space();
      if (peek() == '}') break;
      if (peek() == '%') {
        parse_node();
        continue;
      }
      std::string keyword = word();
      if (keyword == "update") parse_updates();
      else if (keyword == "return") parse_outputs();
      else fail("expected a node, 'update' or 'return', got '" + keyword + "'");
    }
    if (!seen_return_) fail("the graph has no 'return' line (end it with 'return NAME=%N')");
    expect('}');
  }
  /// A nested graph (a flex attention node's score modifier) from the current position.
  std::shared_ptr<const Graph> region() {
    if (nested_) fail("a score modifier cannot hold another");
    Parser nested(text_, pos_);
    nested.nested_ = true;
    nested.parse_body();
    pos_ = nested.pos_;
    return std::make_shared<const Graph>(std::move(nested.g_));
  }
  [[noreturn]] void fail(const std::string& what) const {
    int line = 1;
    for (std::size_t i = 0; i < pos_ && i < text_.size(); ++i) line += text_[i] == '\n';
    throw IrError("ir parse error at line " + std::to_string(line) + ": " + what);
  }
  void skip_space() {
    while (pos_ < text_.size() && std::isspace(static_cast<unsigned char>(text_[pos_]))) ++pos_;
  }
  char peek() {
    skip_space();
    return pos_ < text_.size() ? text_[pos_] : '\0';
  }
  bool accept(char c) {
    if (peek() != c) return false;
    ++pos_;
    return true;
  }
  void expect(char c) {
    if (!accept(c)) fail(std::string("expected '") + c + "'");
  }
  std::string word() {
    skip_space();
    std::size_t start = pos_;
    while (pos_ < text_.size() && (std::isalnum(static_cast<unsigned char>(text_[pos_])) || text_[pos_] == '_' || text_[pos_] == '.' ||
                                   text_[pos_] == '-' || text_[pos_] == '+'))
      ++pos_;
    if (start == pos_) fail("expected a word");
    return std::string(text_.substr(start, pos_ - start));
  }
  void expect_word(std::string_view w) {
    if (word() != w) fail("expected '" + std::string(w) + "'");
  }
  std::int64_t integer() {
    std::string w = word();
    std::int64_t v = 0;
    auto [p, ec] = std::from_chars(w.data(), w.data() + w.size(), v);
    if (ec != std::errc() || p != w.data() + w.size()) fail("expected an integer, got '" + w + "'");
    return v;
  }
  /// An integer in [lo, hi]; `what` names it in the error.
  std::int64_t bounded(std::int64_t lo, std::int64_t hi, const char* what) {
    const std::int64_t v = integer();
    if (v < lo || v > hi) fail(std::string(what) + " " + std::to_string(v) + " is outside [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
    return v;
  }
  ValueId value_ref() {
    expect('%');
    std::int64_t v = integer();
    if (v < 0 || static_cast<std::size_t>(v) >= g_.size()) fail("%" + std::to_string(v) + " is not defined before use");
    return static_cast<ValueId>(v);
  }
  Dim dim() {
    skip_space();
    // The dim's text: a size, a name, or an expression of them ("P+1+Q", "3*E", "(E/4)*2").
    const std::size_t start = pos_;
    for (int depth = 0; pos_ < text_.size(); ++pos_) {
      const char c = text_[pos_];
      if (c == '(') {
        ++depth;
      } else if (c == ')') {
        if (depth-- == 0) break;  // the end of an enclosing list
      } else if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_' && c != '+' && c != '*' && c != '/') {
        break;
      }
    }
    if (start == pos_) fail("expected a dim");
    DimText t{std::string(text_.substr(start, pos_ - start))};
    const Dim d = dim_sum(t);
    if (t.pos != t.text.size()) fail("bad dim '" + t.text + "'");
    return d;
  }
  /// A dim's text being parsed; `parts` bounds its sizes, names and parentheses (each partial result
  /// is a named dim of its own, so a bound on the parts bounds their names).
  struct DimText {
    std::string text;
    std::size_t pos = 0;
    int parts = 0;
  };
  /// dim_sum := dim_product ('+' dim_product)*, left to right, as concat names sums.
  Dim dim_sum(DimText& t) {
    Dim d = dim_product(t);
    while (t.pos < t.text.size() && t.text[t.pos] == '+') {
      ++t.pos;
      d = combine(t, DimOp::sum, d, dim_product(t));
    }
    return d;
  }
  /// dim_product := dim_factor (('*' | '/') dim_factor)*.
  Dim dim_product(DimText& t) {
    Dim d = dim_factor(t);
    while (t.pos < t.text.size() && (t.text[t.pos] == '*' || t.text[t.pos] == '/')) {
      const DimOp op = t.text[t.pos++] == '*' ? DimOp::product : DimOp::quotient;
      d = combine(t, op, d, dim_factor(t));
    }
    return d;
  }
  /// dim_factor := size | name | '(' dim_sum ')'.
  Dim dim_factor(DimText& t) {
    if (t.pos < t.text.size() && t.text[t.pos] == '(') {
      if (++t.parts > kMaxDimParts) fail("dim '" + t.text + "' has more than " + std::to_string(kMaxDimParts) + " parts");
      ++t.pos;
      const Dim d = dim_sum(t);
      if (t.pos >= t.text.size() || t.text[t.pos] != ')') fail("bad dim '" + t.text + "'");
      ++t.pos;
      return d;
    }
    if (++t.parts > kMaxDimParts) fail("dim '" + t.text + "' has more than " + std::to_string(kMaxDimParts) + " parts");
    const std::size_t start = t.pos;
    while (t.pos < t.text.size() && (std::isalnum(static_cast<unsigned char>(t.text[t.pos])) || t.text[t.pos] == '_')) ++t.pos;
    return single_dim(t.text.substr(start, t.pos - start), t.text);
  }
  /// `a op b`: arithmetic on sizes (bounded, and exact for quotients), a derived dim otherwise.
  Dim combine(DimText& t, DimOp op, Dim a, Dim b) {
    if (!is_symbol(a) && !is_symbol(b)) {
      const bool too_large = op == DimOp::sum ? a > kMaxParsedDim - b : op == DimOp::product && b != 0 && a > kMaxParsedDim / b;
      if (too_large) fail("dim '" + t.text + "' is larger than " + std::to_string(kMaxParsedDim));
      if (op == DimOp::quotient && (b == 0 || a % b != 0))
        fail("dim '" + t.text + "': " + std::to_string(a) + "/" + std::to_string(b) + " is not a whole size");
    }
    return g_.derive_dim(op, a, b);
  }
  Dim single_dim(const std::string& w, const std::string& whole) {
    if (w.empty()) fail("bad dim '" + whole + "'");
    if (std::isdigit(static_cast<unsigned char>(w[0]))) {
      std::int64_t v = 0;
      auto [p, ec] = std::from_chars(w.data(), w.data() + w.size(), v);
      if (ec != std::errc() || p != w.data() + w.size()) fail("bad dim '" + whole + "'");
      if (v > kMaxParsedDim) fail("dim " + w + " is larger than " + std::to_string(kMaxParsedDim));
      return v;
    }
    if (!std::isalpha(static_cast<unsigned char>(w[0])) && w[0] != '_') fail("bad dim '" + whole + "'");
    try {
      return g_.symbol(w);
    } catch (const Error& e) {
      fail(e.what());
    }
  }
  /// A static shape's element count must fit in 63 bits (sizes are checked again when bound).
  void check_numel(const Shape& s) {
    std::int64_t n = 1;
    for (int i = 0; i < s.rank; ++i) {
      if (is_symbol(s[i])) continue;
      if (s[i] != 0 && n > std::numeric_limits<std::int64_t>::max() / s[i]) fail("shape has more elements than 64 bits count");
      n *= s[i];
    }
  }
  Shape dims() {
    Shape s;
    expect('[');
    if (accept(']')) return s;
    do {
      if (s.rank == kMaxRank) fail("rank above " + std::to_string(kMaxRank));
      s.push_back(dim());
    } while (accept(','));
    expect(']');
    check_numel(s);
    return s;
  }
  bool boolean() {
    std::string w = word();
    if (w == "true") return true;
    if (w == "false") return false;
    fail("expected true or false, got '" + w + "'");
  }
  double number() {
    std::string w = word();
    if (w == "inf") return HUGE_VAL;
    if (w == "-inf") return -HUGE_VAL;
    if (w == "nan") return std::nan("");
    char* end = nullptr;
    double v = std::strtod(w.c_str(), &end);
    if (end != w.c_str() + w.size()) fail("bad number '" + w + "'");
    return v;
  }

  void parse_node() {
    ValueId id = value_ref_decl();
    expect('=');
    std::string name = word();
    std::optional<Op> op;
    for (Op o : all_ops())
      if (op_name(o) == name) op = o;
    if (!op) fail("unknown op '" + name + "'");
    Node n;
    n.op = *op;
    if (n.op == Op::input) {
      expect('"');
      std::size_t start = pos_;
      while (pos_ < text_.size() && text_[pos_] != '"') ++pos_;
      n.name = std::string(text_.substr(start, pos_ - start));
      expect('"');
    }
    if (accept('(')) {
      if (!accept(')')) {
        do n.inputs.push_back(value_ref());
        while (accept(','));
        expect(')');
      }
    }
    if (accept('{')) {
      do parse_attr(n);
      while (accept(','));
      expect('}');
    }
    expect(':');
    std::string t = word();
    auto dt = parse_dtype(t);
    if (!dt) fail("unknown dtype '" + t + "'");
    n.dtype = *dt;
    n.shape = dims();
    const std::size_t after_type = pos_;
    if (peek() == 'g') n.region = region();
    else pos_ = after_type;                         // errors below name this node's line
    if (n.op == Op::cast) n.attrs.dtype = n.dtype;  // the result type says it
    if (n.op == Op::input) {
      n.attrs.dtype = n.dtype;
      n.attrs.shape = n.shape;
      for (ValueId v : g_.inputs())
        if (g_.node(v).name == n.name) fail("input name '" + n.name + "' used twice");
    }
    // The node's own rules, checked here so that an error names its line.
    if (!arity_accepts(n.op, n.inputs.size()))
      fail(name + " takes " + std::to_string(fixed_operands(n.op)) + (op_info(n.op).arity < 0 ? " or more" : "") + " operands, got " +
           std::to_string(n.inputs.size()));
    if (is_flex_attention(n.op) != (n.region != nullptr))
      fail(name + (n.region ? " takes no score modifier" : " needs its score modifier: ': TYPE graph { ... }' after its type"));
    if (n.region) {
      std::vector<DType> tensors;
      for (std::size_t i = 0; i < modifier_tensor_count(n.op, n.attrs, n.inputs.size()); ++i)
        tensors.push_back(g_.node(n.inputs[fixed_operands(n.op) + i]).dtype);
      if (std::string why = check_region(*n.region, tensors); !why.empty()) fail(name + ": " + why);
    }
    std::vector<Operand> operands;
    std::vector<std::string> types;
    for (ValueId v : n.inputs) {
      operands.push_back({g_.node(v).shape, g_.node(v).dtype});
      types.push_back(g_.type_string(v));
    }
    if (const std::string unread = unread_attribute(n.op, n.attrs); !unread.empty()) fail(unread);
    const ShapeResult r = infer_shape(n.op, operands, n.attrs);
    if (!r.ok()) fail(shape_error_message(n.op, r, types));
    if (!(r.shape == n.shape) || r.dtype != n.dtype)
      fail("%" + std::to_string(id) + " is written " + g_.type_string(n.dtype, n.shape) + " but " + name + " gives " +
           g_.type_string(r.dtype, r.shape));
    if (g_.append_unchecked(std::move(n)) != id) fail("values must be numbered in order");
  }
  ValueId value_ref_decl() {
    expect('%');
    const std::int64_t v = integer();
    if (v != static_cast<std::int64_t>(g_.size())) fail("values must be numbered in order (expected %" + std::to_string(g_.size()) + ")");
    return static_cast<ValueId>(v);
  }
  // One attribute's value from IR text, by its kind (QKV_ATTRS); `what` names it in errors.
  int parse_axis(const char* what) { return static_cast<int>(bounded(-kMaxRank, kMaxRank, what)); }
  std::int64_t parse_size(const char* what) { return bounded(0, kMaxParsedDim, what); }
  std::int8_t parse_operand(const char* what) { return static_cast<std::int8_t>(bounded(0, 127, what)); }
  bool parse_boolean(const char*) { return boolean(); }
  double parse_number(const char*) { return number(); }
  Dim parse_dim(const char*) { return dim(); }
  Shape parse_shape(const char*) { return dims(); }
  CausalAlign parse_align(const char*) {
    std::string w = word();
    if (w == "top_left") return CausalAlign::top_left;
    if (w == "bottom_right") return CausalAlign::bottom_right;
    fail("bad align '" + w + "'");
  }
  DType parse_result_dtype(const char* what) { fail(std::string(what) + " is not written as an attribute (the node's type says it)"); }
  Perm parse_perm(const char*) {
    Shape p = dims();
    Perm v{};
    for (int i = 0; i < p.rank; ++i) {
      if (p[i] < 0 || p[i] >= kMaxRank) fail("perm entry " + g_.dim_name(p[i]) + " is not an axis");
      v[static_cast<std::size_t>(i)] = static_cast<std::int8_t>(p[i]);
    }
    return v;
  }
  void parse_attr(Node& n) {
    std::string key = word();
    expect('=');
#define QKV_PARSE_ATTR(field, type, init, flag, print, kind) \
  if (key == #field) {                                       \
    n.attrs.field = parse_##kind(#field);                    \
    return;                                                  \
  }
    QKV_ATTRS(QKV_PARSE_ATTR)
#undef QKV_PARSE_ATTR
    fail("unknown attribute '" + key + "'");
  }
  void parse_updates() {
    do {
      std::string name = word();
      expect('=');
      const ValueId v = value_ref();
      try {
        g_.set_update(name, v);
      } catch (const Error& e) {
        fail(e.what());
      }
    } while (accept(','));
  }
  void parse_outputs() {
    seen_return_ = true;
    if (peek() == '}') return;  // a graph with no outputs prints as a bare 'return'
    do {
      std::string name = word();
      expect('=');
      const ValueId v = value_ref();
      try {
        g_.set_output(name, v);
      } catch (const Error& e) {
        fail(e.what());
      }
    } while (accept(','));
  }
  bool seen_return_ = false;
  bool nested_ = false;  // parsing a region

  std::string_view text_;
  std::size_t pos_ = 0;
  Graph own_;
  Graph& g_ = own_;
};

}  // namespace

Graph parse_graph(std::string_view text) { return Parser(text).parse(); }

Dim parse_dim(Graph& g, std::string_view text) { return Parser(text, g).parse_dim_only(); }

std::string to_dot(const Graph& g) {
  std::string out = "digraph qkv {\n  rankdir=TB;\n  node [shape=box, fontname=\"monospace\", fontsize=10];\n";
  for (std::size_t i = 0; i < g.size(); ++i) {
    const Node& n = g.nodes()[i];
    std::string label = "%" + std::to_string(i) + " " + std::string(op_name(n.op));
    if (n.op == Op::input) label += " " + n.name;
    if (std::string attrs = print_attrs(g, n); !attrs.empty()) label += "\\n" + attrs;
    label += "\\n" + g.type_string(i);
    out += "  n" + std::to_string(i) + " [label=\"" + label + "\"" + (n.op == Op::input ? ", shape=ellipse" : "") + "];\n";
    for (ValueId v : n.inputs) out += "  n" + std::to_string(v) + " -> n" + std::to_string(i) + ";\n";
  }
  for (const auto& [name, v] : g.updates())
    out += "  \"update_" + name + "\" [label=\"" + name + " :=\", shape=plaintext];\n  n" + std::to_string(v) + " -> \"update_" + name + "\";\n";
  for (const auto& [name, v] : g.outputs())
    out += "  \"out_" + name + "\" [label=\"" + name + "\", shape=plaintext];\n  n" + std::to_string(v) + " -> \"out_" + name + "\";\n";
  return out + "}\n";
}

}  // namespace qkv::ir
