// Graph construction with inference and structural sharing.
#include "ir/graph.hpp"

#include <algorithm>
#include <functional>

#include "ir/error.hpp"
#include "ir/region.hpp"

namespace qkv::ir {

namespace {
void hash_mix(std::size_t& h, std::size_t v) { h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2); }

/// One attribute's hash, by its type (QKV_ATTRS).
template <class T> std::size_t attr_hash(T v) { return static_cast<std::size_t>(v); }  // integers, bools, enums
std::size_t attr_hash(double v) { return v != v ? 0x7ff8u : std::hash<double>{}(v); }  // NaNs are equal
std::size_t attr_hash(const Shape& s) {
  std::size_t h = static_cast<std::size_t>(s.rank);
  for (int i = 0; i < s.rank; ++i) hash_mix(h, static_cast<std::size_t>(s[i]));
  return h;
}
std::size_t attr_hash(const Perm& p) {
  std::size_t h = 0;
  for (auto e : p) hash_mix(h, static_cast<std::size_t>(e));
  return h;
}
}  // namespace

std::size_t node_hash(Op op, const std::vector<ValueId>& inputs, const Attrs& a, const Graph* region) {
  std::size_t h = static_cast<std::size_t>(op);
  for (ValueId v : inputs) hash_mix(h, static_cast<std::size_t>(v));
#define QKV_ATTR_HASH(field, type, init, flag, print, kind) hash_mix(h, attr_hash(a.field));
  QKV_ATTRS(QKV_ATTR_HASH)
#undef QKV_ATTR_HASH
  if (region) hash_mix(h, region_hash(region));
  return h;
}

Dim Graph::symbol(std::string_view name) {
  Dim id = symbol_id(name);
  auto [it, inserted] = symbols_.emplace(id, std::string(name));
  if (!inserted && it->second != name) throw IrError("dim names '" + it->second + "' and '" + std::string(name) + "' collide");
  return id;
}

void Graph::copy_symbols(const Graph& other) {
  for (const auto& [id, name] : other.symbols_)
    if (!other.derived_.contains(id)) symbol(name);
  // A derived dim's parts first, so that its name is built from theirs.
  auto define = [&](auto& self, Dim d) -> void {
    auto it = other.derived_.find(d);
    if (it == other.derived_.end() || symbols_.contains(d)) return;
    self(self, it->second.a);
    self(self, it->second.b);
    derive_dim(it->second.op, it->second.a, it->second.b);
  };
  for (const auto& entry : other.derived_) define(define, entry.first);
}

Dim Graph::derive_dim(DimOp op, Dim a, Dim b) {
  Dim d = derived_dim(op, a, b);
  if (is_symbol(d) && !symbols_.count(d)) {
    // Sums chain without parentheses ("P+1+Q", as concat names them; * and / bind tighter);
    // a product's or quotient's derived operand is parenthesised unless it is a left-hand
    // product or quotient ("E/4*2" is (E/4)*2).
    auto operand = [&](Dim x, bool left) {
      auto it = derived_.find(x);
      const bool bare = it == derived_.end() || op == DimOp::sum || (left && it->second.op != DimOp::sum);
      return bare ? dim_name(x) : "(" + dim_name(x) + ")";
    };
    const char* sign = op == DimOp::sum ? "+" : op == DimOp::product ? "*" : "/";
    symbols_.emplace(d, operand(a, true) + sign + operand(b, false));
    derived_.emplace(d, DerivedDim{op, a, b});
  }
  return d;
}

std::string Graph::dim_name(Dim d) const {
  if (!is_symbol(d)) return std::to_string(d);
  auto it = symbols_.find(d);
  return it == symbols_.end() ? "?" + std::to_string(-d) : it->second;
}

std::string Graph::type_string(DType dtype, const Shape& shape) const {
  std::string s(dtype_name(dtype));
  s += '[';
  for (int i = 0; i < shape.rank; ++i) {
    if (i) s += ',';
    s += dim_name(shape[i]);
  }
  return s + ']';
}

ValueId Graph::add_input(std::string_view name, DType dtype, const Shape& shape) {
  for (std::size_t i = 0; i < nodes_.size(); ++i) {
    const Node& n = nodes_[i];
    if (n.op != Op::input || n.name != name) continue;
    if (n.dtype != dtype || !(n.shape == shape))
      throw ShapeError("input '" + std::string(name) + "' declared twice: " + type_string(n.dtype, n.shape) + " and " + type_string(dtype, shape));
    return static_cast<ValueId>(i);
  }
  Node n;
  n.op = Op::input;
  n.attrs.shape = shape;
  n.attrs.dtype = dtype;
  n.dtype = dtype;
  n.shape = shape;
  n.name = std::string(name);
  return append_unchecked(std::move(n));
}

ValueId Graph::add_like(const Node& n, std::vector<ValueId> inputs) {
  return n.op == Op::input ? add_input(n.name, n.dtype, n.shape) : add(n.op, std::move(inputs), n.attrs, n.region);
}

ValueId Graph::constant(double value, const Shape& shape, Dim rsqrt_of) {
  Attrs a;
  a.value = value;
  a.shape = shape;
  a.rsqrt_of = rsqrt_of;
  return add(Op::constant, {}, a);
}

ValueId Graph::cast(ValueId v, DType dtype) {
  if (node(v).dtype == dtype) return v;
  Attrs to;
  to.dtype = dtype;
  return add(Op::cast, {v}, to);
}

std::string shape_error_message(Op op, const ShapeResult& r, const std::vector<std::string>& types) {
  std::string m(op_name(op));
  m += ": ";
  m += shape_err_name(r.error);
  auto operand = [&](int i) { return i < static_cast<int>(types.size()) ? types[static_cast<std::size_t>(i)] : std::string("?"); };
  switch (r.error) {
    case ShapeErr::none: break;
    case ShapeErr::inner_dims_differ:
    case ShapeErr::not_broadcastable:
    case ShapeErr::element_count_differs: m += " (" + std::to_string(r.lhs) + " vs " + std::to_string(r.rhs) + ")"; break;
    case ShapeErr::axis_out_of_range: m += " (axis " + std::to_string(r.lhs) + " for rank " + std::to_string(r.rhs) + ")"; break;
    case ShapeErr::bad_permutation: m += " (entry " + std::to_string(r.lhs) + " for rank " + std::to_string(r.rhs) + ")"; break;
    case ShapeErr::rank_too_small:
      m += " (operand " + std::to_string(r.operand) + " has rank " + std::to_string(r.lhs) + ", needs " + std::to_string(r.rhs) + ")";
      break;
    case ShapeErr::rank_too_large: m += " (" + std::to_string(r.lhs) + ")"; break;
    case ShapeErr::not_broadcast_target:
      m += " (" + std::to_string(r.lhs) + " vs " + std::to_string(r.rhs) + "; operand " + std::to_string(r.operand) + " is " + operand(r.operand) +
           ")";
      break;
    case ShapeErr::bad_range: m += " (" + std::to_string(r.lhs) + ", " + std::to_string(r.rhs) + " at axis " + std::to_string(r.axis) + ")"; break;
    case ShapeErr::dims_differ:
      m += " (" + std::to_string(r.lhs) + " vs " + std::to_string(r.rhs) + " at axis " + std::to_string(r.axis) + ")";
      break;
    case ShapeErr::bad_probability: break;
    case ShapeErr::not_castable:
    case ShapeErr::not_integer:
    case ShapeErr::not_float:
    case ShapeErr::not_bool:
    case ShapeErr::dtypes_differ: m += " (operand " + std::to_string(r.operand) + " is " + operand(r.operand) + ")"; break;
  }
  if (!types.empty()) {
    m += "; operands ";
    for (std::size_t i = 0; i < types.size(); ++i) m += (i ? ", " : "") + types[i];
  }
  return m;
}

namespace {

/// The attributes an op with these AttrFlag bits reads, by name ("none" for none).
std::string attr_names(std::uint32_t flags) {
  std::string s;
#define QKV_ATTR_NAME(field, type, init, flag, print, kind) \
  if (flags & (flag)) s += (s.empty() ? "" : ", ") + std::string(#field);
  QKV_ATTRS(QKV_ATTR_NAME)
#undef QKV_ATTR_NAME
  return s.empty() ? "none" : s;
}

}  // namespace

std::string unread_attribute(Op op, const Attrs& attrs) {
  const OpInfo& info = op_info(op);
  const Attrs defaults;
  std::string field;
#define QKV_UNREAD_ATTR(name, type, init, flag, print, kind) \
  if (field.empty() && !(info.attrs & (flag)) && !attr_equal(attrs.name, defaults.name)) field = #name;
  QKV_ATTRS(QKV_UNREAD_ATTR)
#undef QKV_UNREAD_ATTR
  if (field.empty()) return {};
  std::string m = std::string(info.name) + ": has no attribute '" + field + "' (it reads " + attr_names(info.attrs) + ")";
  if (field == "value" && (info.attrs & kAttrScale)) m += "; an attention op's scale is its 'scale'";
  if (field == "value" && (info.attrs & kAttrDropout)) m += "; a dropout probability is 'dropout'";
  return m;
}

ValueId Graph::add(Op op, std::vector<ValueId> inputs, Attrs attrs, std::shared_ptr<const Graph> region) {
  QKV_ASSERT(op != Op::input, "use add_input for inputs");
  const OpInfo& info = op_info(op);
  if (!arity_accepts(op, inputs.size()))
    throw IrError(std::string(info.name) + ": expects " + std::to_string(fixed_operands(op)) + (info.arity < 0 ? " or more" : "") + " inputs, got " +
                  std::to_string(inputs.size()));
  if (is_flex_attention(op) != (region != nullptr))
    throw IrError(std::string(info.name) + (region ? ": takes no region" : ": needs its score modifier region"));
  if (const std::string unread = unread_attribute(op, attrs); !unread.empty()) throw IrError(unread);
  std::vector<Operand> operands;
  for (ValueId v : inputs) {
    if (v < 0 || static_cast<std::size_t>(v) >= nodes_.size())
      throw IrError(std::string(info.name) + ": operand %" + std::to_string(v) + " does not exist");
    operands.push_back({node(v).shape, node(v).dtype});
  }
  if (info.attrs & kAttrAxis) {
    int rank = operands.empty() ? 0 : operands[0].shape.rank;
    if (attrs.axis < 0) attrs.axis += rank;
  }
  ShapeResult r = infer_shape(op, operands, attrs);
  if (!r.ok()) {
    std::vector<std::string> types;
    for (ValueId v : inputs) types.push_back(type_string(v));
    throw ShapeError(shape_error_message(op, r, types));
  }
  if (region) {
    std::vector<DType> tensors;
    for (std::size_t i = 0; i < modifier_tensor_count(op, attrs, operands.size()); ++i) tensors.push_back(operands[fixed_operands(op) + i].dtype);
    if (std::string why = check_region(*region, tensors); !why.empty()) throw IrError(std::string(info.name) + ": " + why);
  }
  std::size_t h = node_hash(op, inputs, attrs, region.get());
  auto [lo, hi] = index_.equal_range(h);
  for (auto it = lo; it != hi; ++it) {
    const Node& n = node(it->second);
    if (n.op == op && n.inputs == inputs && n.attrs == attrs && same_region(n.region.get(), region.get())) return it->second;
  }
  if (op == Op::concat) sum_dim(operands[0].shape[attrs.axis], operands[1].shape[attrs.axis]);        // names a derived dim
  if (op == Op::page_gather) derive_dim(DimOp::product, operands[1].shape[1], operands[0].shape[2]);  // n page, likewise
  Node n;
  n.op = op;
  n.inputs = std::move(inputs);
  n.attrs = attrs;
  n.dtype = r.dtype;
  n.shape = r.shape;
  n.region = std::move(region);
  ValueId id = append_unchecked(std::move(n));
  index_.emplace(h, id);
  return id;
}

ValueId Graph::append_unchecked(Node n) {
  nodes_.push_back(std::move(n));
  return static_cast<ValueId>(nodes_.size() - 1);
}

void Graph::set_output(std::string_view name, ValueId value) {
  if (value < 0 || static_cast<std::size_t>(value) >= nodes_.size())
    throw IrError("output '" + std::string(name) + "' names a value that does not exist");
  for (const auto& [n, v] : outputs_)
    if (n == name) throw IrError("output '" + std::string(name) + "' is named twice");
  outputs_.emplace_back(std::string(name), value);
}

void Graph::set_update(std::string_view input, ValueId value) {
  if (value < 0 || static_cast<std::size_t>(value) >= nodes_.size())
    throw IrError("update of '" + std::string(input) + "' names a value that does not exist");
  for (const auto& [n, v] : updates_)
    if (n == input) throw IrError("input '" + std::string(input) + "' is updated twice");
  for (ValueId in : inputs()) {
    const Node& n = node(in);
    if (n.name != input) continue;
    if (n.dtype != node(value).dtype || !(n.shape == node(value).shape))
      throw ShapeError("update of input '" + n.name + "' (" + type_string(in) + ") with a value of type " + type_string(value));
    updates_.emplace_back(std::string(input), value);
    return;
  }
  throw IrError("update of '" + std::string(input) + "': the graph has no such input");
}

std::vector<ValueId> Graph::result_values() const {
  std::vector<ValueId> r;
  for (const auto& [n, v] : outputs_) r.push_back(v);
  for (const auto& [n, v] : updates_) r.push_back(v);
  return r;
}

void Graph::copy_results(const Graph& src, const std::vector<ValueId>& map) {
  for (const auto& [name, v] : src.outputs()) set_output(name, map[static_cast<std::size_t>(v)]);
  for (const auto& [name, v] : src.updates()) set_update(name, map[static_cast<std::size_t>(v)]);
}

std::vector<ValueId> Graph::inputs() const {
  std::vector<ValueId> r;
  for (std::size_t i = 0; i < nodes_.size(); ++i)
    if (nodes_[i].op == Op::input) r.push_back(static_cast<ValueId>(i));
  return r;
}

ValueId Graph::output(std::string_view name) const {
  for (const auto& [n, v] : outputs_)
    if (n == name) return v;
  throw IrError("graph has no output '" + std::string(name) + "'");
}

bool writes_into_operand(const Graph& g, ValueId v) {
  const Node& n = g.node(v);
  if (n.op != Op::cache_write && n.op != Op::page_write) return false;
  const ValueId cache = n.inputs[0];
  const Node& c = g.node(cache);
  if (c.op != Op::input || c.dtype != DType::f32) return false;  // a 16-bit cache is widened where kernels read it: copied
  bool updated = false;
  for (const auto& [name, u] : g.updates()) {
    updated |= name == c.name && u == v;
    if (u == cache) return false;  // another held input takes the cache's old value
  }
  if (!updated) return false;
  for (const auto& [name, o] : g.outputs())
    if (o == cache) return false;
  for (const Node& other : g.nodes())
    if (&other != &n && std::find(other.inputs.begin(), other.inputs.end(), cache) != other.inputs.end()) return false;
  return true;
}

}  // namespace qkv::ir
