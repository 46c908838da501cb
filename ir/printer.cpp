// Printing, parsing and drawing of graphs.
#include "ir/printer.hpp"

#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <optional>

#include "ir/error.hpp"
#include "ir/verifier.hpp"

namespace qkv::ir {

namespace {

std::string format_double(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

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

std::string print_attrs(const Graph& g, const Node& n) {
  std::uint32_t f = op_info(n.op).attrs;
  const Attrs& a = n.attrs;
  std::string s;
  auto add = [&](const std::string& part) { s += (s.empty() ? "" : ", ") + part; };
  if (f & kAttrAxis) add("axis=" + std::to_string(a.axis));
  if (f & kAttrKeepdim) add(std::string("keepdim=") + (a.keepdim ? "true" : "false"));
  if (f & kAttrTranspose) {
    add(std::string("transpose_a=") + (a.transpose_a ? "true" : "false"));
    add(std::string("transpose_b=") + (a.transpose_b ? "true" : "false"));
  }
  if (f & kAttrPerm) {
    std::string p = "perm=[";
    for (int i = 0; i < n.shape.rank; ++i) p += (i ? "," : "") + std::to_string(a.perm[static_cast<std::size_t>(i)]);
    add(p + "]");
  }
  if ((f & kAttrShape) && n.op != Op::input) add("shape=" + format_dims(g, a.shape));
  if (f & kAttrValue) add("value=" + format_double(a.value));
  if (f & kAttrDepth) add("depth=" + std::to_string(a.depth));
  if (f & kAttrRange) {
    add("begin=" + std::to_string(a.begin));
    add("end=" + std::to_string(a.end));
  }
  if (f & kAttrCausal) add(std::string("causal=") + (a.causal ? "true" : "false"));
  if (f & kAttrAlign) add("align=" + std::string(align_name(a.align)));
  if ((f & kAttrWindow) && a.window != 0) add("window=" + std::to_string(a.window));  // printed when set
  return s;
}

std::string print(const Graph& g) {
  std::string out = "graph {\n";
  for (std::size_t i = 0; i < g.size(); ++i) {
    const Node& n = g.nodes()[i];
    out += "  %" + std::to_string(i) + " = " + std::string(op_name(n.op));
    if (n.op == Op::input) out += " \"" + n.name + "\"";
    if (!n.inputs.empty()) {
      out += "(";
      for (std::size_t j = 0; j < n.inputs.size(); ++j) out += (j ? ", %" : "%") + std::to_string(n.inputs[j]);
      out += ")";
    }
    if (std::string attrs = print_attrs(g, n); !attrs.empty()) out += " {" + attrs + "}";
    out += " : " + g.type_string(i) + "\n";
  }
  if (!g.updates().empty()) {
    out += "  update";
    for (std::size_t i = 0; i < g.updates().size(); ++i)
      out += (i ? ", " : " ") + g.updates()[i].first + "=%" + std::to_string(g.updates()[i].second);
    out += "\n";
  }
  out += "  return";
  for (std::size_t i = 0; i < g.outputs().size(); ++i)
    out += (i ? ", " : " ") + g.outputs()[i].first + "=%" + std::to_string(g.outputs()[i].second);
  return out + "\n}\n";
}

namespace {

class Parser {
 public:
  explicit Parser(std::string_view text) : text_(text) {}

  Graph parse() {
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
    expect('}');
    skip_space();
    if (pos_ != text_.size()) fail("text after the closing brace");
    verify(g_);
    return std::move(g_);
  }

 private:
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
    while (pos_ < text_.size() && (std::isalnum(static_cast<unsigned char>(text_[pos_])) || text_[pos_] == '_' ||
                                   text_[pos_] == '.' || text_[pos_] == '-' || text_[pos_] == '+'))
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
  ValueId value_ref() {
    expect('%');
    std::int64_t v = integer();
    if (v < 0 || static_cast<std::size_t>(v) >= g_.size()) fail("%" + std::to_string(v) + " is not defined before use");
    return static_cast<ValueId>(v);
  }
  Dim dim() {
    skip_space();
    return dim_of(word());
  }
  /// "64", "N", or a derived dim "P+1" (left to right, as concat names them).
  Dim dim_of(const std::string& w) {
    if (auto plus = w.rfind('+'); plus != std::string::npos && plus > 0)
      return g_.sum_dim(dim_of(w.substr(0, plus)), dim_of(w.substr(plus + 1)));
    if (std::isdigit(static_cast<unsigned char>(w[0]))) {
      std::int64_t v = 0;
      auto [p, ec] = std::from_chars(w.data(), w.data() + w.size(), v);
      if (ec != std::errc() || p != w.data() + w.size()) fail("bad dim '" + w + "'");
      return v;
    }
    return g_.symbol(w);
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
    if (n.op == Op::cast) n.attrs.dtype = n.dtype;  // the result type says it
    if (n.op == Op::input) {
      n.attrs.dtype = n.dtype;
      n.attrs.shape = n.shape;
    }
    if (g_.append_unchecked(std::move(n)) != id) fail("values must be numbered in order");
  }
  ValueId value_ref_decl() {
    expect('%');
    return static_cast<ValueId>(integer());
  }
  void parse_attr(Node& n) {
    std::string key = word();
    expect('=');
    Attrs& a = n.attrs;
    if (key == "axis") a.axis = static_cast<int>(integer());
    else if (key == "keepdim") a.keepdim = boolean();
    else if (key == "transpose_a") a.transpose_a = boolean();
    else if (key == "transpose_b") a.transpose_b = boolean();
    else if (key == "causal") a.causal = boolean();
    else if (key == "depth") a.depth = integer();
    else if (key == "begin") a.begin = integer();
    else if (key == "end") a.end = integer();
    else if (key == "window") a.window = integer();
    else if (key == "value") a.value = number();
    else if (key == "shape") a.shape = dims();
    else if (key == "align") {
      std::string w = word();
      if (w == "top_left") a.align = CausalAlign::top_left;
      else if (w == "bottom_right") a.align = CausalAlign::bottom_right;
      else fail("bad align '" + w + "'");
    } else if (key == "perm") {
      Shape p = dims();
      for (int i = 0; i < p.rank; ++i) a.perm[static_cast<std::size_t>(i)] = static_cast<std::int8_t>(p[i]);
    } else {
      fail("unknown attribute '" + key + "'");
    }
  }
  void parse_updates() {
    do {
      std::string name = word();
      expect('=');
      g_.set_update(name, value_ref());
    } while (accept(','));
  }
  void parse_outputs() {
    do {
      std::string name = word();
      expect('=');
      g_.set_output(name, value_ref());
    } while (accept(','));
  }

  std::string_view text_;
  std::size_t pos_ = 0;
  Graph g_;
};

}  // namespace

Graph parse_graph(std::string_view text) { return Parser(text).parse(); }

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
