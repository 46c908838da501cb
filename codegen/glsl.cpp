// GLSL generation: one shader family per op category, elementwise expressions from one table.
// These kernels are put together here from short parts (their helpers and the subgroup row
// kernel are codegen/glsl/ files), a GLSL line per statement.
#include "codegen/glsl.hpp"

#include <algorithm>
#include <bit>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <functional>
#include <limits>
#include <optional>
#include <span>

#include "codegen/attention_glsl.hpp"
#include "codegen/fusion.hpp"
#include "codegen/glsl_detail.hpp"
#include "codegen/glsl_files.hpp"
#include "codegen/matmul_glsl.hpp"
#include "codegen/push_constants.hpp"
#include "ir/bind.hpp"
#include "ir/error.hpp"
#include "ir/passes/passes.hpp"
#include "ir/printer.hpp"
#include "ir/random.hpp"
#include "ir/region.hpp"

namespace qkv::codegen {

namespace {

using ir::Node;
using ir::Op;
using ir::OpCategory;
using ir::Shape;

/// A GLSL float of exactly `v` as float32, by its bits: infinities and NaN included.
std::string float_literal(double v) {
  char hex[40];
  std::snprintf(hex, sizeof hex, "uintBitsToFloat(0x%08xu)", std::bit_cast<std::uint32_t>(static_cast<float>(v)));
  return hex;
}

/// The GLSL expression of each elementwise op over operands a, b (and condition c for where).
std::string elementwise_expr(Op op) {
#define QKV_GLSL_EXPR(id, arity, category, attrs, shape_rule, gradient, cost_rule, decomposition, autocast, roles, cases_of, doc, host, glsl, ...) \
  if (op == Op::id) return glsl;
  QKV_UNARY_OPS(QKV_GLSL_EXPR)
  QKV_BINARY_OPS(QKV_GLSL_EXPR)
  QKV_COMPARE_OPS(QKV_GLSL_EXPR)
#undef QKV_GLSL_EXPR
  // Case lists (QKV_*_CASES, macros) clang-format cannot read:
  // clang-format off
  switch (op) {
    case Op::cast: return "a";  // buffers hold ids and booleans as floats already
    case Op::where: return "c != 0.0 ? a : b";
    case Op::permute:
    case Op::broadcast_to: return "a";
    QKV_UNARY_CASES
    QKV_BINARY_CASES
    QKV_COMPARE_CASES
    QKV_SOURCE_CASES
    QKV_REDUCE_CASES
    QKV_MASK_CASES
    QKV_ATTENTION_CASES
    QKV_COMPOSITE_CASES
    case Op::matmul:
    case Op::reshape:
    case Op::slice:
    case Op::concat:
    case Op::cache_write:
    case Op::page_write: break;
  }
  // clang-format on
  QKV_UNREACHABLE(std::string(ir::op_name(op)) + " has no elementwise expression");
}

/// Operand names in binding order for an elementwise op.
std::vector<std::string> operand_names(Op op, int arity) {
  if (op == Op::where) return {"c", "a", "b"};
  if (arity == 2) return {"a", "b"};
  return {"a"};
}

/// A kernel's declarations: buffers x0, x1, ... holding `inputs` and y holding `out`
/// (detail::held_element), the push constants `push` declares, and the workgroup's size
/// (Target::invocations).
std::string header(const std::vector<DType>& inputs, DType out, const PushConstants& push, std::uint32_t local_x, std::uint32_t local_y = 1) {
  std::string s = "#version 450\n";
  if (is_half(out) || std::any_of(inputs.begin(), inputs.end(), [](DType t) { return is_half(t); }))
    s += "#extension GL_EXT_shader_16bit_storage : require\n";
  s += "layout(local_size_x = " + std::to_string(local_x) + ", local_size_y = " + std::to_string(local_y) + ") in;\n";
  for (std::size_t i = 0; i < inputs.size(); ++i)
    s += "layout(std430, binding = " + std::to_string(i) + ") readonly buffer In" + std::to_string(i) + " { " + detail::held_element(inputs[i]) +
         " x" + std::to_string(i) + "[]; };\n";
  s += "layout(std430, binding = " + std::to_string(inputs.size()) + ") writeonly buffer Out { " + detail::held_element(out) + " y[]; };\n";
  return s + push.glsl();
}
/// `source` with the signature of the push constants it declares.
KernelSource declared(KernelSource source, const PushConstants& push) {
  source.push_signature = push.signature();
  return source;
}

std::string header(int inputs, const PushConstants& push, std::uint32_t local_x) {
  return header(std::vector<DType>(static_cast<std::size_t>(inputs), DType::f32), DType::f32, push, local_x);
}

}  // namespace

/// Philox4x32-10 as ir/random.hpp defines it (codegen/glsl/qkv_philox.glsl).
std::string detail::philox_function() {
  return glsl_template("qkv_philox.glsl", {{"KEY1", std::to_string(ir::kDropoutKey1) + "u"},
                                           {"M0", std::to_string(ir::kPhiloxM0) + "u"},
                                           {"M1", std::to_string(ir::kPhiloxM1) + "u"},
                                           {"W0", std::to_string(ir::kPhiloxW0) + "u"},
                                           {"W1", std::to_string(ir::kPhiloxW1) + "u"}});
}

std::uint32_t detail::push_word(std::int64_t v) {
  QKV_ASSERT(v >= 0 && v <= 0xffffffffll, "push constant out of range");
  return static_cast<std::uint32_t>(v);
}

std::array<std::int64_t, ir::kMaxRank> detail::contiguous_strides(const Shape& s) {
  std::array<std::int64_t, ir::kMaxRank> st{};
  std::int64_t acc = 1;
  for (int i = s.rank - 1; i >= 0; --i) {
    st[static_cast<std::size_t>(i)] = acc;
    acc *= s[i];
  }
  return st;
}

std::array<std::int64_t, ir::kMaxRank> detail::broadcast_strides(const Shape& in, int rank) {
  auto c = contiguous_strides(in);
  std::array<std::int64_t, ir::kMaxRank> st{};
  for (int i = 0; i < rank; ++i) {
    int j = i - (rank - in.rank);
    st[static_cast<std::size_t>(i)] = (j < 0 || in[j] == 1) ? 0 : c[static_cast<std::size_t>(j)];
  }
  return st;
}

namespace {

/// The statements giving an invocation its element i, returning past the push constant `bound`.
std::string element_index(const std::string& bound) {
  const std::string i = "  uint i = gl_GlobalInvocationID.x + gl_GlobalInvocationID.y * gl_NumWorkGroups.x * gl_WorkGroupSize.x;\n";
  return i + "  if (i >= pc." + bound + ") return;\n";
}

/// Workgroups of `invocations` for `total` invocations: past 65535 along x, rows along y.
std::array<std::uint32_t, 3> linear_groups(std::int64_t total, std::uint32_t invocations) {
  std::int64_t groups = (total + invocations - 1) / invocations;
  if (groups == 0) groups = 1;
  std::int64_t x = groups < 65535 ? groups : 65535;
  return {static_cast<std::uint32_t>(x), static_cast<std::uint32_t>((groups + x - 1) / x), 1};
}

using detail::push_word;

/// `expr` with the operand names a, b, c (whole identifiers only) replaced by `values`.
std::string substitute(const std::string& expr, const std::vector<std::string>& names, const std::vector<std::string>& values) {
  std::string out;
  auto ident = [](char ch) { return std::isalnum(static_cast<unsigned char>(ch)) || ch == '_'; };
  for (std::size_t i = 0; i < expr.size(); ++i) {
    const bool alone = (i == 0 || !ident(expr[i - 1])) && (i + 1 == expr.size() || !ident(expr[i + 1]));
    std::size_t k = 0;
    while (k < names.size() && !(alone && names[k].size() == 1 && names[k][0] == expr[i])) ++k;
    out += k < names.size() ? values[k] : std::string(1, expr[i]);
  }
  return out;
}

}  // namespace

namespace {

/// Statements summing a row into `acc` (declared before), reading element e as read(e). A row
/// of one axis: one loop over its n elements (k from `first` by `step`). A merged sum (the
/// axes of several sums, `order` gives each one's axis of the chain's shape, the first sum's
/// first): nested loops in the order those sums took, innermost the first's, each level's
/// partial sum added to the next, so the rounding is the separate sums' (one flat loop over the
/// product went past a two-level sum's error budget). The outermost loop starts at `first`.
std::string sum_row(const std::function<std::string(const std::string&)>& read, const std::vector<int>& order, const std::string& first,
                    const std::string& step, const std::string& indent) {
  if (order.size() < 2) return indent + "for (uint k = " + first + "; k < n; k += " + step + ") acc += " + read("base + k * inner") + ";\n";
  const int m = static_cast<int>(order.size());
  const int last = *std::max_element(order.begin(), order.end());
  auto dim = [](int d) { return "pc.dims[" + std::to_string(d) + "]"; };
  std::string s, offset;
  for (int l = 0; l < m; ++l) {
    std::string stride = "1u";  // in rows of `inner`: the merged axes after this one
    for (int d = order[static_cast<std::size_t>(l)] + 1; d <= last; ++d) stride += " * " + dim(d);
    offset += std::string(l ? " + " : "") + "k" + std::to_string(l) + " * (" + stride + ")";
  }
  std::string in = indent;
  s += in + "float t" + std::to_string(m - 1) + " = 0.0;\n";
  for (int l = m - 1; l >= 0; --l) {
    const std::string k = "k" + std::to_string(l);
    const bool outer = l == m - 1;
    s += in + "for (uint " + k + " = " + (outer ? first : "0u") + "; " + k + " < " + dim(order[static_cast<std::size_t>(l)]) + "; " + k +
         " += " + (outer ? step : "1u") + ") {\n";
    in += "  ";
    s += l > 0 ? in + "float t" + std::to_string(l - 1) + " = 0.0;\n" : in + "t0 += " + read("base + (" + offset + ") * inner") + ";\n";
  }
  for (int l = 0; l < m; ++l) {
    in.resize(in.size() - 2);
    s += in + "}\n";
    if (l + 1 < m) s += in + "t" + std::to_string(l + 1) + " += t" + std::to_string(l) + ";\n";
  }
  return s + indent + "acc = t" + std::to_string(m - 1) + ";\n";
}

/// Statements setting `m` (declared before) to the max over a row of `value` (an expression of
/// its element's k, which `elements` loops over), NaN if any is NaN (through a flag: GLSL's max
/// is not defined for NaN); with `lanes`, combined across the lanes sharing the row (qkv_max).
std::string max_row(const std::string& m, const std::string& elements, const std::string& value, bool lanes, const std::string& indent) {
  std::string s = indent + m + " = uintBitsToFloat(0xff800000u);\n" + indent + "{\n" + indent + "  float nan_seen = 0.0;\n" + indent + "  " +
                  elements + " { float v = " + value + "; if (isnan(v)) nan_seen = 1.0; else " + m + " = max(" + m + ", v); }\n";
  if (lanes) s += indent + "  " + m + " = qkv_max(" + m + ");\n" + indent + "  nan_seen = qkv_max(nan_seen);\n";
  return s + indent + "  if (nan_seen > 0.0) " + m + " = uintBitsToFloat(0x7fc00000u);\n" + indent + "}\n";
}

/// One invocation per row: the invocations of a SIMD lane set take consecutive rows.
std::string axis_body_per_invocation(Op op, const std::string& open, const std::string& close, const std::vector<int>& sum_order,
                                     const detail::Store& out) {
  auto read = [&](const std::string& index) { return open + index + close; };
  std::string s = "void main() {\n" + element_index("rows");
  s += "  uint n = pc.n, inner = pc.inner;\n";
  s += "  uint base = (i / inner) * n * inner + i % inner;\n";
  const std::string e = read("base + k * inner");
  QKV_ASSERT(op == Op::reduce_sum || op == Op::reduce_max || op == Op::softmax, "not an axis op");
  if (op == Op::reduce_sum) {
    s += "  float acc = 0.0;\n" + sum_row(read, sum_order, "0u", "1u", "  ") + "  y[i] = " + out("acc") + ";\n";
  } else if (op == Op::reduce_max) {
    s += "  float acc = uintBitsToFloat(0xff800000u);\n";
    s += "  for (uint k = 0u; k < n; ++k) { float v = " + e + "; acc = (isnan(v) || v > acc) ? v : acc; }\n";
    s += "  y[i] = " + out("acc") + ";\n";
  } else {  // softmax
    s += "  float m = uintBitsToFloat(0xff800000u);\n";
    s += "  for (uint k = 0u; k < n; ++k) { float v = " + e + "; m = (isnan(v) || v > m) ? v : m; }\n";
    s += "  if (isinf(m) && m < 0.0) m = 0.0;  // a row of -inf gives zeros\n";
    s += "  float total = 0.0;\n";
    s += "  for (uint k = 0u; k < n; ++k) total += exp(" + e + " - m);\n";
    s += "  float inv = total == 0.0 ? 0.0 : 1.0 / total;\n";
    s += "  for (uint k = 0u; k < n; ++k) y[base + k * inner] = " + out("exp(" + e + " - m) * inv") + ";\n";
  }
  return s + "}\n";
}

/// A kernel sharing rows across lanes (codegen/glsl/subgroup_rows.glsl): qkv_sum and qkv_max over
/// the lanes sharing a row, and main() running the statements `row` for each row an invocation
/// takes part in, kRows per workgroup.
std::string subgroup_rows_main(std::uint32_t rows, std::uint32_t invocations, const std::string& row) {
  return glsl_template("subgroup_rows.glsl", {{"ROWS", std::to_string(rows)}, {"INVOCATIONS", std::to_string(invocations)}, {"ROW", row}});
}

/// A row's sum, max or softmax over lanes sharing it (subgroup_rows.glsl says how the rows are
/// shared). NaN propagates as the reference has it: a lane that saw one makes the row's max NaN
/// (through a flag's max: GLSL's max is not defined for NaN), and a softmax row of -inf gives
/// zeros.
std::string axis_body_per_subgroup(Op op, const std::string& open, const std::string& close, const Target& target, std::uint32_t rows,
                                   const std::vector<int>& sum_order, const detail::Store& out) {
  auto read = [&](const std::string& index) { return open + index + close; };
  const std::string lanes = "for (uint k = lane; k < n; k += step)";
  std::string s;
  const std::string max_pass = "    float m;\n" + max_row("m", lanes, read("base + k * inner"), true, "    ");
  QKV_ASSERT(op == Op::reduce_sum || op == Op::reduce_max || op == Op::softmax, "not an axis op");
  if (op == Op::reduce_sum) {
    s += "    float acc = 0.0;\n" + sum_row(read, sum_order, "lane", "step", "    ");
    s += "    acc = qkv_sum(acc);\n";
    s += "    if (writer) y[i] = " + out("acc") + ";\n";
  } else if (op == Op::reduce_max) {
    s += max_pass + "    if (writer) y[i] = " + out("m") + ";\n";
  } else {  // softmax
    const std::string e = read("base + k * inner");
    s += max_pass;
    s += "    if (isinf(m) && m < 0.0) m = 0.0;  // a row of -inf gives zeros\n";
    s += "    float total = 0.0;\n";
    s += "    " + lanes + " total += exp(" + e + " - m);\n";
    s += "    total = qkv_sum(total);\n";
    s += "    float inv = total == 0.0 ? 0.0 : 1.0 / total;\n";
    s += "    " + lanes + " y[base + k * inner] = " + out("exp(" + e + " - m) * inv") + ";\n";
  }
  return subgroup_rows_main(rows, target.invocations, s);
}

/// Whether reductions share rows across lanes: on GPUs with subgroup arithmetic. Not on lavapipe,
/// where an invocation per row was 2x to 7x faster than a subgroup per row (qkv_graph_bench
/// rows/*: R4096_C256 11 ms against 29, R512_C4096 23 against 47, R16384_C32 6 against 32):
/// its SIMD lanes already take 8 rows at once, and each subgroup operation is a shuffle
/// sequence.
bool subgroup_rows_kernel(const Target& t) { return t.subgroup_reductions && t.subgroup_size > 0 && !t.cpu_device; }

/// Rows per workgroup of the subgroup kernel: one per subgroup of the workgroup's invocations.
std::uint32_t subgroup_rows(const Target& t) { return std::max<std::uint32_t>(t.invocations / t.subgroup_size, 1); }

}  // namespace

std::string detail::axis_body(Op op, const std::string& open, const std::string& close, const Target& target, const std::vector<int>& sum_order,
                              const Store& store) {
  if (subgroup_rows_kernel(target)) return axis_body_per_subgroup(op, open, close, target, subgroup_rows(target), sum_order, store);
  return axis_body_per_invocation(op, open, close, sum_order, store);
}

std::string detail::rounded_value(DType rounded, const std::string& value) {
  return rounded == DType::f16 ? "qkv_round_f16(" + value + ")" : rounded == DType::bf16 ? "qkv_round_bf16(" + value + ")" : value;
}

std::string detail::row_body(const std::vector<RowReduction>& reductions, const std::string& chain, const Target& target, const Store& store) {
  const bool lanes = subgroup_rows_kernel(target);
  std::string s;
  const std::string elements = "for (uint k = lane; k < n; k += step)";
  for (const RowReduction& r : reductions) {
    const std::string at = r.function + "(base + k * inner)";
    if (r.op == Op::reduce_sum) {
      s += "    " + r.variable + " = 0.0;\n    " + elements + " " + r.variable + " += " + at + ";\n";
      if (lanes) s += "    " + r.variable + " = qkv_sum(" + r.variable + ");\n";
    } else {
      QKV_ASSERT(r.op == Op::reduce_max, "row kernels reduce by sums and maxima");
      s += max_row(r.variable, elements, at, lanes, "    ");
    }
  }
  s += "    " + elements + " y[base + k * inner] = " + store(chain + "(base + k * inner)") + ";\n";
  if (lanes) return subgroup_rows_main(subgroup_rows(target), target.invocations, s);
  std::string main = "void main() {\n" + element_index("rows");
  main += "  uint n = pc.n, inner = pc.inner, lane = 0u, step = 1u;\n";
  main += "  {\n";
  main += "    uint base = (i / inner) * n * inner + i % inner;\n";
  return main + s + "  }\n}\n";
}

std::string detail::axis_shader(const std::string& header, const std::string& body, const Target& target) {
  if (!subgroup_rows_kernel(target)) return header + body;
  const std::size_t line = header.find('\n');  // after #version
  return header.substr(0, line + 1) + "#extension GL_KHR_shader_subgroup_basic : require\n#extension GL_KHR_shader_subgroup_arithmetic : require\n" +
         header.substr(line + 1) + body;
}

PushConstants detail::axis_push_constants() {
  using T = PushConstants::Type;
  PushConstants p;
  p.scalar("rows", T::u32, "outer * inner: the rows reduced")
      .scalar("n", T::u32, "the reduced axis' size")
      .scalar("inner", T::u32, "elements after the axis (a row's stride)")
      .scalar("mode", T::u32, "0: an invocation per row, 1: a subgroup per row, 2: a workgroup per row");
  return p;
}

KernelLaunch detail::axis_launch(std::int64_t outer, std::int64_t n, std::int64_t inner, const Target& target, PushConstants::Values& push) {
  KernelLaunch l;
  const std::int64_t rows = outer * inner;
  // Rows shorter than a subgroup take an invocation each (a subgroup would idle most lanes); on
  // a GPU rows of 2048 or more take a workgroup (a subgroup's lanes would add 32 or more each).
  const std::uint32_t mode = !subgroup_rows_kernel(target) || n < static_cast<std::int64_t>(target.subgroup_size) ? 0 : n >= 2048 ? 2 : 1;
  push.set("rows", push_word(rows)).set("n", push_word(n)).set("inner", push_word(inner)).set("mode", mode);
  if (mode == 1) {
    const std::int64_t per_group = subgroup_rows(target);
    l.groups = linear_groups((rows + per_group - 1) / per_group * target.invocations, target.invocations);
  } else {
    l.groups = linear_groups(mode == 2 ? rows * target.invocations : rows, target.invocations);
  }
  return l;
}

void detail::declare_operand_strides(PushConstants& p, int rank, int operands) {
  if (rank == 0) return;  // no dims to step through: the loops over them are unrolled away
  p.array("dims", rank, "the dims of the elements computed");
  for (int k = 0; k < operands; ++k) p.array(strides_name(k), rank, "x" + std::to_string(k) + "'s strides over them (0 where it broadcasts)");
}

PushConstants detail::elementwise_push_constants(int rank, int operands) {
  PushConstants p;
  p.scalar("elements", PushConstants::Type::u32, "the output's elements");
  declare_operand_strides(p, rank, operands);
  return p;
}

std::string detail::strides_name(int operand) { return "x" + std::to_string(operand) + "_strides"; }

void detail::set_operand_strides(PushConstants::Values& push, const Shape& shape, const std::vector<Shape>& operands) {
  if (shape.rank == 0) return;
  push.set_array("dims", std::span(shape.dims.data(), static_cast<std::size_t>(shape.rank)));
  for (std::size_t k = 0; k < operands.size(); ++k) {
    const auto st = broadcast_strides(operands[k], shape.rank);
    push.set_array(strides_name(static_cast<int>(k)), std::span(st.data(), static_cast<std::size_t>(shape.rank)));
  }
}

std::string detail::operand_offsets(int rank, int operands) {
  std::string s = "  uint rem = i;\n";
  for (int k = 0; k < operands; ++k) s += "  uint o" + std::to_string(k) + " = 0u;\n";
  for (int d = rank - 1; d >= 0; --d) {
    const std::string dim = "pc.dims[" + std::to_string(d) + "]";
    s += "  { uint idx = rem % " + dim + "; rem /= " + dim + ";";
    for (int k = 0; k < operands; ++k) s += " o" + std::to_string(k) + " += idx * pc." + strides_name(k) + "[" + std::to_string(d) + "];";
    s += " }\n";
  }
  return s;
}

std::string detail::elementwise_expression(Op op, const std::vector<std::string>& operands) {
  return substitute(elementwise_expr(op), operand_names(op, static_cast<int>(operands.size())), operands);
}

std::string detail::kernel_header(const std::vector<DType>& inputs, DType out, const PushConstants& push, const Target& target) {
  return header(inputs, out, push, target.invocations);
}

std::string detail::Store::operator()(const std::string& value) const { return narrowed(held, rounded_value(rounded, value)); }

std::string detail::Store::suffix(const std::vector<DType>& inputs) const {
  std::string s = is_half(rounded) ? "_round_" + std::string(dtype_name(rounded)) : "";
  for (std::size_t k = 0; k < inputs.size(); ++k)
    if (is_half(inputs[k])) s += "_" + std::string(dtype_name(inputs[k])) + "x" + std::to_string(k);
  if (is_half(held)) s += "_" + std::string(dtype_name(held)) + "y";
  return s;
}

std::vector<Op> detail::Store::rounds() const {
  std::vector<Op> ops;
  for (DType t : {rounded, held})
    if (is_half(t)) ops.push_back(t == DType::f16 ? Op::round_f16 : Op::round_bf16);
  return ops;
}

std::string detail::linear_index() { return element_index("elements"); }

std::array<std::uint32_t, 3> detail::elementwise_groups(std::int64_t total, const Target& target) { return linear_groups(total, target.invocations); }

namespace {
/// The helper functions of the ops `uses` names, each once.
template <class Uses> std::string helpers_for(Uses uses) {
  // Each in codegen/glsl/, with why it is not GLSL's built-in.
  struct Helper {
    Op op, also;  // the ops calling it (`also` the same op where one does)
    const char* file;
  };
  const Helper helpers[] = {{Op::log, Op::log, "qkv_log.glsl"},
                            {Op::tanh, Op::tanh, "qkv_tanh.glsl"},
                            {Op::erf, Op::erf, "qkv_erf.glsl"},
                            {Op::sin, Op::cos, "qkv_sincos.glsl"},
                            {Op::round_f16, Op::round_f16, "qkv_round_f16.glsl"},
                            {Op::round_bf16, Op::round_bf16, "qkv_round_bf16.glsl"}};
  std::string s;
  for (const Helper& h : helpers)
    if (uses(h.op) || uses(h.also)) s += glsl_file(h.file);
  return s;
}
}  // namespace

std::string detail::math_helpers_of(const std::vector<Op>& ops) {
  return helpers_for([&](Op op) { return std::find(ops.begin(), ops.end(), op) != ops.end(); });
}

std::string detail::math_helpers(const ir::Graph& region, bool log) {
  return helpers_for([&](Op op) {
    if (op == Op::log && log) return true;
    return std::any_of(region.nodes().begin(), region.nodes().end(), [&](const Node& n) { return n.op == op; });
  });
}

std::string detail::region_function(const ir::Graph& region, const std::string& name, const std::vector<std::string>& outputs) {
  QKV_ASSERT(outputs.size() == 1 || outputs.size() == 2, "a region function returns a float or a vec2");
  std::string s = std::string(outputs.size() == 1 ? "float " : "vec2 ") + name + "(float score, uint q_idx, uint kv_idx) {\n";
  auto value = [](ir::ValueId v) { return "v" + std::to_string(v); };
  // Only what the results read: a tensor no result needs is not loaded.
  std::vector<bool> live(region.size(), false);
  for (const std::string& o : outputs) live[static_cast<std::size_t>(region.output(o))] = true;
  for (std::size_t i = region.size(); i-- > 0;)
    if (live[i])
      for (ir::ValueId in : region.nodes()[i].inputs) live[static_cast<std::size_t>(in)] = true;
  for (std::size_t i = 0; i < region.size(); ++i) {
    const Node& n = region.nodes()[i];
    const auto v = static_cast<ir::ValueId>(i);
    if (!live[i]) continue;
    std::string rhs;
    if (n.op == Op::input) {
      if (v == ir::kRegionScore) rhs = "score";
      else if (v == ir::kRegionQIdx) rhs = "float(q_idx)";
      else if (v == ir::kRegionKvIdx) rhs = "float(kv_idx)";
      else {
        const std::string t = std::to_string(v - ir::kRegionFixedInputs);
        rhs = "T" + t + "[t" + t + "_at + q_idx * t" + t + "_row + kv_idx * t" + t + "_col]";
      }
      rhs += ";  // " + n.name;
    } else if (n.op == Op::constant) {
      rhs = float_literal(n.attrs.value) + ";  // " + ir::format_number(n.attrs.value);
    } else {
      std::vector<std::string> operands;
      for (ir::ValueId in : n.inputs) operands.push_back(value(in));
      const auto names = operand_names(n.op, static_cast<int>(n.inputs.size()));
      // where's operands are (c, a, b) in binding order; its inputs are (condition, then, else).
      rhs = substitute(elementwise_expr(n.op), names, operands) + ";";
    }
    s += "  float " + value(v) + " = " + rhs + "\n";
  }
  if (outputs.size() == 1) s += "  return " + value(region.output(outputs[0])) + ";\n}\n";
  else s += "  return vec2(" + value(region.output(outputs[0])) + ", " + value(region.output(outputs[1])) + ");\n}\n";
  return s;
}

namespace {

/// The GLSL of a monotone unary op's value at an interval's end, ivf_<op>(a): its row's GLSL
/// expression, with the ends of its domain and +inf answered by its host expression (the GLSL
/// built-ins' results there are not specified). nullopt for the periodic ops (iv_periodic).
std::optional<std::string> interval_end(Op op) {
  const ir::Monotone m = ir::unary_monotone(op);
  if (m == ir::Monotone::periodic) return std::nullopt;
  const double start = m == ir::Monotone::increasing_from_zero ? 0.0 : -std::numeric_limits<double>::infinity();
  const double inf = std::numeric_limits<double>::infinity();
  auto expr = [&](auto f, const char* glsl) {
    return "a <= " + float_literal(start) + " ? " + float_literal(f(start)) + " : a == iv_inf() ? " + float_literal(f(inf)) + " : " + glsl;
  };
#define QKV_INTERVAL_END(id, arity, category, attrs, shape_rule, gradient, cost_rule, decomposition, autocast, roles, cases_of, doc, host, glsl, \
                         ...)                                                                                                                    \
  if (op == Op::id) return expr([](double x) { return host; }, glsl);
  QKV_UNARY_OPS(QKV_INTERVAL_END)
#undef QKV_INTERVAL_END
  return std::nullopt;
}

}  // namespace

std::string detail::interval_helpers(const ir::Graph* region) {
  // Interval arithmetic in GLSL (codegen/glsl/intervals.glsl), rule for rule ir::bound_region's
  // (ir/region.cpp): a bound end is never NaN (a NaN sum or product of ends is read as the other
  // corners cover it), and NaN becomes possible exactly where the C++ rules say so. Kept beside
  // them by the same tests: the vulkan kernels skip a tile only when this says every score there
  // is -inf.
  std::string s(glsl_file("intervals.glsl"));
  if (!region) return s;
  std::vector<Op> done;
  for (const Node& n : region->nodes()) {
    if (ir::op_info(n.op).category != OpCategory::unary || n.op == Op::cast) continue;
    const auto end = interval_end(n.op);
    if (!end || std::find(done.begin(), done.end(), n.op) != done.end()) continue;
    done.push_back(n.op);
    const std::string name(ir::op_name(n.op));
    s += "float ivf_" + name + "(float a) { return " + *end + "; }\n";
    switch (ir::unary_monotone(n.op)) {
      case ir::Monotone::increasing: s += "Iv iv_" + name + "(Iv a) { return Iv(ivf_" + name + "(a.lo), ivf_" + name + "(a.hi), a.nan); }\n"; break;
      case ir::Monotone::increasing_from_zero:  // NaN below 0
        s += "Iv iv_" + name + "(Iv a) {\n  bool below = a.lo < 0.0;\n  return Iv(ivf_" + name + "(below ? 0.0 : a.lo), ivf_" + name +
             "(a.hi < 0.0 ? 0.0 : a.hi), a.nan || below);\n}\n";
        break;
      case ir::Monotone::decreasing: s += "Iv iv_" + name + "(Iv a) { return Iv(ivf_" + name + "(a.hi), ivf_" + name + "(a.lo), a.nan); }\n"; break;
      case ir::Monotone::periodic: break;
    }
  }
  return s;
}

std::string detail::region_bound_function(const ir::Graph& region, const std::string& name, const std::vector<std::pair<ir::ValueId, bool>>* keeps) {
  std::string s = (keeps ? "bool " : "Iv ") + name + "(Iv q_idx, Iv kv_idx";
  for (std::size_t i = 0; i < ir::region_tensors(region); ++i) s += ", Iv t" + std::to_string(i);
  s += ") {\n";
  // The index and tensor inputs are the parameters, by name; every other node is a local v<i>.
  auto value = [&](ir::ValueId v) { return v != ir::kRegionScore && region.node(v).op == Op::input ? region.node(v).name : "v" + std::to_string(v); };
  for (std::size_t i = 0; i < region.size(); ++i) {
    const Node& n = region.nodes()[i];
    const auto v = static_cast<ir::ValueId>(i);
    if (n.op == Op::input && v != ir::kRegionScore) continue;
    auto arg = [&](std::size_t k) { return value(n.inputs[k]); };
    std::string rhs, note;
    // Case lists (QKV_*_CASES, macros) clang-format cannot read:
    // clang-format off
    switch (n.op) {
      case Op::input: rhs = "iv_unknown()"; break;  // the score: anything
      case Op::constant: rhs = "iv_exact(" + float_literal(n.attrs.value) + ")"; break;
      case Op::cast:  // i32 or bool as f32: the same values
        rhs = arg(0);
        note = "  // cast";
        break;
      QKV_UNARY_CASES
        rhs = ir::unary_monotone(n.op) == ir::Monotone::periodic ? "iv_periodic(" + arg(0) + ")"
                                                                  : "iv_" + std::string(ir::op_name(n.op)) + "(" + arg(0) + ")";
        break;
      QKV_BINARY_CASES
      QKV_COMPARE_CASES rhs = "iv_" + std::string(ir::op_name(n.op)) + "(" + arg(0) + ", " + arg(1) + ")"; break;
      case Op::where: rhs = "iv_where(" + arg(0) + ", " + arg(1) + ", " + arg(2) + ")"; break;
      // Not in a region (ir::check_region allows elementwise ops only): nothing is known.
      QKV_REDUCE_CASES
      QKV_CONTRACT_CASES
      QKV_LAYOUT_CASES
      QKV_MASK_CASES
      QKV_COMPOSITE_CASES
      QKV_ATTENTION_CASES rhs = "iv_unknown()"; break;
    }
    // clang-format on
    s += "  Iv " + value(v) + " = " + rhs + ";" + note + "\n";
  }
  if (!keeps) return s + "  return " + value(region.output("mod")) + ";\n}\n";
  std::string all = "true";
  for (const auto& [cond, when_true] : *keeps)
    all += when_true ? " && !" + value(cond) + ".nan && !iv_holds(" + value(cond) + ", 0.0)" : " && iv_is(" + value(cond) + ", 0.0)";
  return s + "  return " + all + ";\n}\n";
}

namespace {

/// Elementwise family: out index -> per-operand offsets through strides (0 where broadcast).
/// An elementwise op (or a permute, or a cast between 32-bit types) on its own: operands and
/// output in the dtypes their storage holds (ir::ValueStorage::held: 16-bit inputs read in place,
/// an output narrowed into its cast's 16-bit storage), widened and narrowed as they are loaded
/// and stored.
KernelSource elementwise_source(const ir::Graph& g, const ir::StoragePlan& storage, ir::ValueId v, const Target& target) {
  const Node& n = g.node(v);
  int rank = n.shape.rank;
  int arity = static_cast<int>(n.inputs.size());
  auto names = operand_names(n.op, arity);
  std::vector<DType> held;
  for (ir::ValueId in : n.inputs) held.push_back(storage.held(in));
  const detail::Store store{DType::f32, storage.held(v)};
  const PushConstants push = detail::elementwise_push_constants(rank, arity);
  std::string s = header(held, store.held, push, target.invocations);
  const std::vector<Op> rounds = store.rounds();
  s += helpers_for([&](Op op) { return op == n.op || std::find(rounds.begin(), rounds.end(), op) != rounds.end(); });
  s += "void main() {\n" + element_index("elements") + detail::operand_offsets(rank, arity);
  for (int k = 0; k < arity; ++k)
    s += "  float " + names[static_cast<std::size_t>(k)] + " = " +
         detail::widened(held[static_cast<std::size_t>(k)], "x" + std::to_string(k) + "[o" + std::to_string(k) + "]") + ";\n";
  s += "  y[i] = " + store(elementwise_expr(n.op)) + ";\n}\n";
  return declared({std::string(ir::op_name(n.op)) + "_r" + std::to_string(rank) + store.suffix(held), s, arity + 1}, push);
}

}  // namespace

namespace detail {

const char* held_element(DType t) { return t == DType::f16 ? "float16_t" : t == DType::bf16 ? "uint16_t" : "float"; }

std::string widened(DType t, const std::string& element) {
  return t == DType::f16 ? "float(" + element + ")" : t == DType::bf16 ? "uintBitsToFloat(uint(" + element + ") << 16)" : element;
}

std::string narrowed(DType t, const std::string& value) {
  return t == DType::f16    ? "float16_t(qkv_round_f16(" + value + "))"
         : t == DType::bf16 ? "uint16_t(floatBitsToUint(qkv_round_bf16(" + value + ")) >> 16)"
                            : value;
}

}  // namespace detail

namespace {

/// The push constants of the kernels that are not elementwise, reductions, matmuls or flash
/// attention (casts to and from 16 bits, constants, masks, slices and joins, lookups), declared
/// once for the shader and its launch: first the elements, an invocation each (`in_place`: a
/// cache update in place, the new rows'), then what the op needs.
PushConstants per_element_push_constants(const Node& n, bool in_place = false) {
  using T = PushConstants::Type;
  PushConstants p;
  p.scalar("elements", T::u32, in_place ? "the new rows' elements" : "the output's elements");
  const std::string axis = "elements after the axis";
  if (n.op == Op::constant) p.scalar("value", T::f32, "the value");
  if (n.op == Op::one_hot) p.scalar("depth", T::u32, "the classes: the last dim's size");
  if (n.op == Op::embedding) p.scalar("width", T::u32, "a table row's elements").scalar("rows", T::u32, "the table's rows (other ids give zeros)");
  if (n.op == Op::causal_mask)
    p.scalar("keys", T::u32, "Lk: the mask's columns")
        .scalar("shift", T::i32, "Lk - Lq where aligned bottom-right, else 0")
        .scalar("window", T::i32, "the sliding window (0: none)");
  if (n.op == Op::slice)
    p.scalar("inner", T::u32, axis)
        .scalar("size", T::u32, "the output's size along the axis")
        .scalar("operand_size", T::u32, "the operand's size along the axis")
        .scalar("begin", T::u32, "the first index taken");
  if (n.op == Op::concat) p.scalar("inner", T::u32, axis).scalar("a_size", T::u32, "x0's size along the axis").scalar("b_size", T::u32, "x1's");
  if (n.op == Op::cache_write)
    p.scalar("inner", T::u32, axis).scalar("rows", T::u32, "the cache's size along the axis").scalar("fresh", T::u32, "the new rows' size along it");
  if (n.op == Op::page_write)
    p.scalar("dim", T::u32, "D: a row's elements")
        .scalar("tokens", T::u32, "T: the new tokens per sequence")
        .scalar("heads", T::u32, "H")
        .scalar("page", T::u32, "rows per page")
        .scalar("slots", T::u32, "B T: the slots given")
        .scalar("capacity", T::u32, "P page: the pages' rows (other slots are dropped)");
  if (n.op == Op::page_gather)
    p.scalar("dim", T::u32, "D: a row's elements")
        .scalar("heads", T::u32, "H")
        .scalar("page", T::u32, "rows per page")
        .scalar("width", T::u32, "n: the table's entries per sequence")
        .scalar("pool", T::u32, "P: the pages (other entries read zeros)");
  if (n.op == Op::iota) p.scalar("inner", T::u32, axis).scalar("size", T::u32, "the axis' size");
  if (n.op == Op::dropout_mask)
    p.scalar("threshold", T::u32, "kept where the draw is at least 2^32 p").scalar("kept", T::f32, "the kept value, 1 / (1 - p)");
  return p;
}

/// Elements each invocation of a cast to or from a 16-bit float converts.
constexpr std::int64_t kCastElements = 8;

/// A cast between f32 and a 16-bit float held as it is (GL_EXT_shader_16bit_storage): f16 as
/// float16_t, bf16 as the high half of an f32 in a uint16_t. Its operand has its shape, so both
/// are contiguous; each invocation converts kCastElements in a row (fewer invocations: lavapipe
/// pays per invocation). A narrowing cast rounds to nearest even first (the value itself is then
/// exact in 16 bits, whatever the device's conversion rounds to).
KernelSource cast16_source(const ir::Graph& g, const Node& n, const Target& target) {
  const DType from = g.node(n.inputs[0]).dtype, to = n.dtype;
  const PushConstants push = per_element_push_constants(n);
  std::string s = "#version 450\n#extension GL_EXT_shader_16bit_storage : require\n";
  s += "layout(local_size_x = " + std::to_string(target.invocations) + ", local_size_y = 1) in;\n";
  s += "layout(std430, binding = 0) readonly buffer In0 { " + std::string(detail::held_element(from)) + " x0[]; };\n";
  s += "layout(std430, binding = 1) writeonly buffer Out { " + std::string(detail::held_element(to)) + " y[]; };\n";
  s += push.glsl();
  s += helpers_for([&](Op op) { return (op == Op::round_f16 && to == DType::f16) || (op == Op::round_bf16 && to == DType::bf16); });
  s += "void main() {\n";
  s += "  uint first = (gl_GlobalInvocationID.x + gl_GlobalInvocationID.y * gl_NumWorkGroups.x * gl_WorkGroupSize.x) * " +
       std::to_string(kCastElements) + "u;\n";
  s += "  for (uint i = first; i < min(first + " + std::to_string(kCastElements) + "u, pc.elements); ++i) {\n";
  s += "    float a = " + detail::widened(from, "x0[i]") + ";\n";
  s += "    y[i] = " + detail::narrowed(to, "a") + ";\n";
  s += "  }\n}\n";
  return declared({"cast_" + std::string(dtype_name(from)) + "_" + std::string(dtype_name(to)), s, 2}, push);
}

/// The kernels that compute each output element alone, an invocation each: the GLSL of their
/// element i, reading the push constants per_element_push_constants declares for the op. Slices and
/// joins see their tensors as [outer, n, inner] along the axis.
struct PerElement {
  Op op;
  bool in_place;  // a cache update writing its new rows into the cache's storage
  const char* name;
  int inputs;
  const char* body;
};
const PerElement kPerElement[] = {
    {Op::constant, false, "constant", 0, "  y[i] = pc.value;\n"},
    {Op::one_hot, false, "one_hot", 1, "  y[i] = x0[i / pc.depth] == float(i % pc.depth) ? 1.0 : 0.0;\n"},
    // x0 = the ids, x1 = the table.
    {Op::embedding, false, "embedding", 2,
     "  const int id = int(x0[i / pc.width]);\n"
     "  y[i] = id >= 0 && id < int(pc.rows) ? x1[uint(id) * pc.width + i % pc.width] : 0.0;\n"},
    {Op::causal_mask, false, "causal_mask", 1,
     "  int row = int(i / pc.keys);\n  int col = int(i % pc.keys);\n"
     "  int limit = row + pc.shift, window = pc.window;\n"
     "  y[i] = (col <= limit && (window == 0 || col > limit - window)) ? 1.0 : 0.0;\n"},
    {Op::slice, false, "slice", 1,
     "  uint inner = pc.inner, per = pc.size * inner;\n"
     "  uint o = i / per, j = (i % per) / inner, r = i % inner;\n"
     "  y[i] = x0[(o * pc.operand_size + pc.begin + j) * inner + r];\n"},
    {Op::concat, false, "concat", 2,
     "  uint inner = pc.inner, na = pc.a_size, nb = pc.b_size, per = (na + nb) * inner;\n"
     "  uint o = i / per, j = (i % per) / inner, r = i % inner;\n"
     "  y[i] = j < na ? x0[(o * na + j) * inner + r] : x1[(o * nb + j - na) * inner + r];\n"},
    // As a copy: every element of the cache x0, from the new rows x1 where they are written at
    // x2[0].
    {Op::cache_write, false, "cache_write", 3,
     "  const uint inner = pc.inner, rows = pc.rows, fresh = pc.fresh;\n"
     "  const int k = int((i / inner) % rows) - int(x2[0]);\n"
     "  y[i] = k >= 0 && k < int(fresh) ? x1[((i / inner / rows) * fresh + uint(k)) * inner + i % inner] : x0[i];\n"},
    // In place (ir::writes_into_operand): y is the cache's own storage (x0 is not read); only
    // the new rows x1 are written, an invocation per new element.
    {Op::cache_write, true, "cache_write_in_place", 3,
     "  const uint inner = pc.inner, rows = pc.rows, fresh = pc.fresh;\n"
     "  const int row = int((i / inner) % fresh) + int(x2[0]);\n"
     "  if (row >= 0 && row < int(rows)) y[((i / inner / fresh) * rows + uint(row)) * inner + i % inner] = x1[i];\n"},
    // As a copy: every element of the pages x0 [P, H, page, D], from the new rows x1 [B, H, T, D]
    // where a slot of x2 [B, T] names its row (slots are distinct: the first found is the one).
    {Op::page_write, false, "page_write", 3,
     "  const uint d = pc.dim, page = pc.page, heads = pc.heads, tokens = pc.tokens;\n"
     "  const uint row = (i / d) % page, head = (i / d / page) % heads, slot = (i / d / page / heads) * page + row;\n"
     "  int from = -1;\n"
     "  for (uint j = 0u; j < pc.slots && from < 0; ++j)\n"
     "    if (int(x2[j]) == int(slot)) from = int(j);\n"
     "  y[i] = from < 0 ? x0[i] : x1[(((uint(from) / tokens) * heads + head) * tokens + uint(from) % tokens) * d + i % d];\n"},
    // In place (ir::writes_into_operand): y is the pages' own storage (x0 is not read); an
    // invocation per new element of x1 [B, H, T, D] writes it at its token's slot in x2 [B, T].
    {Op::page_write, true, "page_write_in_place", 3,
     "  const uint d = pc.dim, page = pc.page, heads = pc.heads, tokens = pc.tokens;\n"
     "  const uint token = (i / d) % tokens, head = (i / d / tokens) % heads, b = i / d / tokens / heads;\n"
     "  const int slot = int(x2[b * tokens + token]);\n"
     "  if (slot >= 0 && slot < int(pc.capacity))\n"
     "    y[(((uint(slot) / page) * heads + head) * page + uint(slot) % page) * d + i % d] = x1[i];\n"},
    // Every element of [B, H, n page, D] from the pages x0 [P, H, page, D] through the block table
    // x1 [B, n]: zero where the entry names no page of the pool.
    {Op::page_gather, false, "page_gather", 2,
     "  const uint d = pc.dim, page = pc.page, heads = pc.heads, width = pc.width;\n"
     "  const uint row = (i / d) % (width * page), head = (i / d / (width * page)) % heads, b = i / d / (width * page) / heads;\n"
     "  const float entry = x1[b * width + row / page];\n"
     "  y[i] = entry >= 0.0 && entry < float(pc.pool) ? x0[((uint(entry) * heads + head) * page + row % page) * d + i % d] : 0.0;\n"},
    {Op::iota, false, "iota", 1, "  y[i] = float((i / pc.inner) % pc.size);\n"},
    // x1[0] = the seed.
    {Op::dropout_mask, false, "dropout_mask", 2, "  y[i] = qkv_philox(i, uint(x1[0])) >= pc.threshold ? pc.kept : 0.0;\n"},
};

KernelSource per_element_source(const Node& n, bool in_place, const Target& target) {
  for (const PerElement& k : kPerElement) {
    if (k.op != n.op || k.in_place != in_place) continue;
    const PushConstants push = per_element_push_constants(n, in_place);
    const std::string helpers = n.op == Op::dropout_mask ? detail::philox_function() : std::string();
    const std::string s = header(k.inputs, push, target.invocations) + helpers + "void main() {\n" + element_index("elements") + k.body + "}\n";
    return declared({k.name, s, k.inputs + 1}, push);
  }
  QKV_UNREACHABLE(std::string(ir::op_name(n.op)) + " has no per-element kernel");
}

/// Reductions and softmax over one axis, seen as [outer, n, inner]: one invocation or one
/// subgroup per row.
/// A reduction's or softmax's kernel: its input as its storage holds it (a 16-bit input read in
/// place), its values stored rounded or narrowed (as the storage plan says).
KernelSource axis_source(const ir::Graph& g, const ir::StoragePlan& storage, ir::ValueId v, const Target& target) {
  const Op op = g.node(v).op;
  const DType in = storage.held(g.node(v).inputs[0]);
  const detail::Store store{storage[v].rounded, storage.held(v)};
  const std::string read = detail::widened(in, "x0[@]"), helpers = detail::math_helpers_of(store.rounds());
  const std::size_t at = read.find('@');
  const PushConstants push = detail::axis_push_constants();
  const std::string body = helpers + detail::axis_body(op, read.substr(0, at), read.substr(at + 1), target, {}, store);
  return declared(
      {std::string(ir::op_name(op)) + store.suffix({in}), detail::axis_shader(header({in}, store.held, push, target.invocations), body, target), 2},
      push);
}

}  // namespace

bool implements(const Node& n) {
  switch (ir::op_info(n.op).category) {
    case OpCategory::composite: return n.op == Op::softmax || n.op == Op::page_gather || (ir::is_fused_attention(n.op) && detail::attention_fits(n));
    case OpCategory::source:
    case OpCategory::unary:
    case OpCategory::binary:
    case OpCategory::select:
    case OpCategory::compare:
    case OpCategory::reduce:
    case OpCategory::contract:
    case OpCategory::layout:
    case OpCategory::mask: return true;
  }
  return false;
}

bool cast16(const ir::Graph& g, const Node& n) { return n.op == Op::cast && (is_half(n.dtype) || is_half(g.node(n.inputs[0]).dtype)); }

bool elementwise(const ir::Graph& g, const Node& n) {
  if (cast16(g, n)) return false;
  switch (ir::op_info(n.op).category) {
    case OpCategory::unary:
    case OpCategory::binary:
    case OpCategory::select:
    case OpCategory::compare: return true;
    case OpCategory::layout: return n.op == Op::broadcast_to;
    case OpCategory::source:
    case OpCategory::reduce:
    case OpCategory::contract:
    case OpCategory::mask:
    case OpCategory::composite: return false;
  }
  return false;
}

bool axis_reduction(const Node& n) { return n.op == Op::reduce_sum || n.op == Op::reduce_max || n.op == Op::softmax; }

namespace detail {

MatmulDtypes matmul_dtypes(const ir::Graph& g, const ir::StoragePlan& storage, ir::ValueId mm, bool own_output) {
  const Node& n = g.node(mm);
  MatmulDtypes d{storage.held(n.inputs[0]), storage.held(n.inputs[1]), own_output ? storage.held(mm) : DType::f32, false};
  d.f16_values = storage[n.inputs[0]].f16_numbers && storage[n.inputs[1]].f16_numbers;
  return d;
}

}  // namespace detail

int storage_buffers(const Node& n) {
  // The flash kernels' tile counts, the forward's split buffer, the forward output beside a tangent.
  return static_cast<int>(n.inputs.size()) + 1 + (ir::is_fused_attention(n.op) ? 1 : 0) + (detail::attention_splits_keys(n) ? 1 : 0) +
         (ir::attention_roles(n.op).jvp() ? 1 : 0);
}

ir::ValueId written_by_tangent(const ir::Graph& g, const ir::StoragePlan& storage, ir::ValueId v) {
  return v + 1 < static_cast<ir::ValueId>(g.size()) && forward_beside(g, storage, v + 1) == v ? v + 1 : -1;
}

ir::ValueId forward_beside(const ir::Graph& g, const ir::StoragePlan& storage, ir::ValueId v) {
  const Node& n = g.node(v);
  if (v == 0 || !ir::is_fused_attention(n.op) || !ir::attention_roles(n.op).jvp() || !implements(n)) return -1;
  const ir::ValueId f = v - 1;
  const ir::ValueStorage& s = storage[f];
  const bool placed = s.into.into >= 0 && storage[s.into.into].kind == ir::StorageKind::placed;  // written through strides
  if (!ir::attention_roles(g.node(f).op).forward() || !ir::is_tangent_of(n, g.node(f)) || !implements(g.node(f)) ||
      s.kind != ir::StorageKind::kernel || placed)
    return -1;
  return f;
}

std::optional<std::string> unsupported_reason(const ir::Graph& g, const Node& n) {
  int words = 0;
  switch (ir::op_info(n.op).category) {
    case OpCategory::unary:
    case OpCategory::binary:
    case OpCategory::select:
    case OpCategory::compare:
    case OpCategory::layout: words = detail::elementwise_push_constants(n.shape.rank, static_cast<int>(n.inputs.size())).words(); break;
    case OpCategory::contract: words = detail::matmul_push_words(n.shape.rank); break;
    case OpCategory::source:
    case OpCategory::mask: words = per_element_push_constants(n).words(); break;
    case OpCategory::reduce: words = detail::axis_push_constants().words(); break;
    case OpCategory::composite:
      words = n.op == Op::softmax            ? detail::axis_push_constants().words()
              : n.op == Op::page_gather      ? per_element_push_constants(n).words()
              : ir::is_fused_attention(n.op) ? detail::attention_push_words(n)
                                             : kMaxPushWords + 1;
      break;
  }
  (void)g;
  if (words > kMaxPushWords)
    return std::string(ir::op_name(n.op)) + " of rank " + std::to_string(n.shape.rank) + " needs " + std::to_string(words) +
           " push-constant words, more than " + std::to_string(kMaxPushWords);
  return std::nullopt;
}

KernelSource kernel_source(const ir::Graph& g, const ir::StoragePlan& storage, ir::ValueId v, const Target& target) {
  const Node& n = g.node(v);
  // Case lists (QKV_*_CASES, macros) clang-format cannot read:
  // clang-format off
  switch (n.op) {
    case Op::constant:
    case Op::slice:
    case Op::concat:
    case Op::iota:
    case Op::dropout_mask:
    case Op::one_hot:
    case Op::embedding:
    case Op::page_gather:  // read by other kernels than attention's (which read pages in place)
    case Op::causal_mask: return per_element_source(n, false, target);
    QKV_UNARY_CASES
    QKV_BINARY_CASES
    QKV_COMPARE_CASES
    case Op::cast:
      if (cast16(g, n)) return cast16_source(g, n, target);
      return elementwise_source(g, storage, v, target);
    case Op::where:
    case Op::broadcast_to:
    case Op::permute: return elementwise_source(g, storage, v, target);
    case Op::cache_write:
    case Op::page_write: return per_element_source(n, ir::writes_into_operand(g, v), target);
    QKV_REDUCE_CASES
    case Op::softmax: return axis_source(g, storage, v, target);
    case Op::matmul: return detail::matmul_source(n, target, detail::matmul_dtypes(g, storage, v, true));
    QKV_ATTENTION_CASES {
      std::vector<DType> held;  // q, k, v, then dy or the tangents (paged: their pages')
      for (ir::ValueId in : detail::attention_operands(g, storage, v)) held.push_back(storage.held(in));
      const ir::ValueId f = forward_beside(g, storage, v);
      return detail::attention_source(n, held, storage.held(v), storage[v].rounded,
                                      detail::attention_cooperative(g, storage, v, target) ? &target : nullptr,
                                      detail::attention_paging(g, storage, v),
                                      f < 0 ? detail::Beside{} : detail::Beside{true, storage.held(f), storage[f].rounded},
                                      detail::packed_sequences(g, n));
    }
    case Op::input:
    case Op::reshape:
    case Op::log_softmax:  // decomposed before code generation
    case Op::sink_softmax:
    case Op::reduce_mean: break;
  }
  // clang-format on
  QKV_UNREACHABLE(std::string(ir::op_name(n.op)) + " has no kernel");
}

bool specialized(const Node& n) { return n.op == Op::matmul || ir::is_fused_attention(n.op); }

namespace {

/// Push constants and workgroups of a kPerElement kernel: an invocation per element (per new
/// element of a cache updated in place), the members per_element_push_constants declares.
KernelLaunch per_element_launch(const ir::Graph& g, ir::ValueId v, const std::vector<Shape>& shapes, const Target& target) {
  const Node& n = g.node(v);
  const Shape& os = shapes[static_cast<std::size_t>(v)];
  auto in_shape = [&](int k) -> const Shape& { return shapes[static_cast<std::size_t>(n.inputs[static_cast<std::size_t>(k)])]; };
  // An axis along which a slice, a join, a cache update or iota is taken, with the elements after it.
  const Shape& xs = n.op == Op::iota || n.inputs.empty() ? os : in_shape(0);
  std::int64_t inner = 1;
  for (int i = n.attrs.axis + 1; i < xs.rank; ++i) inner *= xs[i];
  const bool in_place = (n.op == Op::cache_write || n.op == Op::page_write) && ir::writes_into_operand(g, v);
  const std::int64_t elements = in_place ? in_shape(1).numel() : os.numel();
  const PushConstants declaration = per_element_push_constants(n, in_place);
  PushConstants::Values p = declaration.values();
  p.set("elements", push_word(elements));
  if (n.op == Op::constant) p.set_float("value", ir::bound_value(g, n, shapes));
  if (n.op == Op::one_hot) p.set("depth", push_word(n.attrs.depth));
  if (n.op == Op::embedding) {
    const Shape& table = in_shape(1);
    const std::int64_t width = table[0] == 0 ? 0 : table.numel() / table[0];
    p.set("width", push_word(std::max<std::int64_t>(width, 1))).set("rows", push_word(table[0]));
  }
  if (n.op == Op::causal_mask)
    p.set("keys", push_word(os[1]))
        .set_int("shift", n.attrs.align == ir::CausalAlign::bottom_right ? os[1] - os[0] : 0)
        .set_int("window", n.attrs.window);
  if (n.op == Op::slice)
    p.set("inner", push_word(inner))
        .set("size", push_word(os[n.attrs.axis]))
        .set("operand_size", push_word(xs[n.attrs.axis]))
        .set("begin", push_word(n.attrs.begin));
  if (n.op == Op::concat || n.op == Op::cache_write)  // the operand's size along the axis, and the new rows'
    p.set("inner", push_word(inner))
        .set(n.op == Op::concat ? "a_size" : "rows", push_word(xs[n.attrs.axis]))
        .set(n.op == Op::concat ? "b_size" : "fresh", push_word(in_shape(1)[n.attrs.axis]));
  if (n.op == Op::page_write) {
    const Shape &pages = in_shape(0), &fresh = in_shape(1);
    p.set("dim", push_word(pages[3]))
        .set("tokens", push_word(fresh[2]))
        .set("heads", push_word(pages[1]))
        .set("page", push_word(pages[2]))
        .set("slots", push_word(fresh[0] * fresh[2]))
        .set("capacity", push_word(pages[0] * pages[2]));
  }
  if (n.op == Op::page_gather) {
    const Shape &pages = in_shape(0), &table = in_shape(1);
    p.set("dim", push_word(pages[3]))
        .set("heads", push_word(pages[1]))
        .set("page", push_word(pages[2]))
        .set("width", push_word(table[1]))
        .set("pool", push_word(pages[0]));
  }
  if (n.op == Op::iota) p.set("inner", push_word(inner)).set("size", push_word(os[n.attrs.axis]));
  if (n.op == Op::dropout_mask) p.set("threshold", ir::dropout_threshold(n.attrs.dropout)).set_float("kept", ir::dropout_keep_value(n.attrs.dropout));
  KernelLaunch l;
  l.push = p.words();
  l.push_signature = declaration.signature();
  l.groups = linear_groups(elements, target.invocations);
  return l;
}

}  // namespace

std::string work_split(const ir::Graph& g, ir::ValueId v, const std::vector<Shape>& shapes, const Target& target) {
  return detail::attention_work_split(g, v, shapes, target);
}

KernelLaunch kernel_launch(const ir::Graph& g, const ir::StoragePlan& storage, ir::ValueId v, const std::vector<Shape>& shapes,
                           const Target& target) {
  const Node& n = g.node(v);
  const Shape& os = shapes[static_cast<std::size_t>(v)];
  auto in_shape = [&](int k) -> const Shape& { return shapes[static_cast<std::size_t>(n.inputs[static_cast<std::size_t>(k)])]; };
  KernelLaunch l;
  // Packs the words of `declaration` set by `set`.
  auto packed = [&](const PushConstants& declaration, const std::function<void(PushConstants::Values&)>& set) {
    PushConstants::Values push = declaration.values();
    set(push);
    l.push = push.words();
    l.push_signature = declaration.signature();
  };
  if (cast16(g, n)) {
    packed(per_element_push_constants(n), [&](PushConstants::Values& p) { p.set("elements", push_word(os.numel())); });
    l.groups = linear_groups((os.numel() + kCastElements - 1) / kCastElements, target.invocations);
    return l;
  }
  // Case lists (QKV_*_CASES, macros) clang-format cannot read:
  // clang-format off
  switch (n.op) {
    case Op::constant:
    case Op::causal_mask:
    case Op::slice:
    case Op::concat:
    case Op::cache_write:
    case Op::page_write:
    case Op::iota:
    case Op::dropout_mask:
    case Op::one_hot:
    case Op::page_gather:
    case Op::embedding: return per_element_launch(g, v, shapes, target);
    QKV_UNARY_CASES
    QKV_BINARY_CASES
    QKV_COMPARE_CASES
    case Op::cast:
    case Op::where:
    case Op::broadcast_to:
    case Op::permute: {
      std::vector<Shape> read(n.inputs.size());
      for (std::size_t k = 0; k < n.inputs.size(); ++k) read[k] = in_shape(static_cast<int>(k));
      l.groups = linear_groups(os.numel(), target.invocations);
      packed(detail::elementwise_push_constants(os.rank, static_cast<int>(n.inputs.size())), [&](auto& p) {
        p.set("elements", push_word(os.numel()));
        if (n.op != Op::permute) return detail::set_operand_strides(p, os, read);
        // A permute reads its operand through the permuted strides.
        if (os.rank == 0) return;
        const auto c = detail::contiguous_strides(in_shape(0));
        std::array<std::int64_t, ir::kMaxRank> st{};
        for (int d = 0; d < os.rank; ++d) st[static_cast<std::size_t>(d)] = c[static_cast<std::size_t>(n.attrs.perm[static_cast<std::size_t>(d)])];
        p.set_array("dims", std::span(os.dims.data(), static_cast<std::size_t>(os.rank)));
        p.set_array(detail::strides_name(0), std::span(st.data(), static_cast<std::size_t>(os.rank)));
      });
      return l;
    }
    QKV_REDUCE_CASES
    case Op::softmax: {
      const Shape& xs = in_shape(0);
      std::int64_t outer = 1, inner = 1;
      for (int i = 0; i < n.attrs.axis; ++i) outer *= xs[i];
      for (int i = n.attrs.axis + 1; i < xs.rank; ++i) inner *= xs[i];
      const PushConstants declaration = detail::axis_push_constants();
      PushConstants::Values push = declaration.values();
      l = detail::axis_launch(outer, xs[n.attrs.axis], inner, target, push);
      l.push = push.words();
      l.push_signature = declaration.signature();
      return l;
    }
    case Op::matmul: return detail::matmul_launch(n, shapes, os, target, detail::matmul_dtypes(g, storage, v, true));
    QKV_ATTENTION_CASES return detail::attention_launch(g, storage, v, shapes, target);
    case Op::input:
    case Op::reshape:
    case Op::log_softmax:
    case Op::sink_softmax:
    case Op::reduce_mean: break;
  }
  // clang-format on
  QKV_UNREACHABLE(std::string(ir::op_name(n.op)) + " has no kernel");
}

std::string emit_glsl(const ir::Graph& g, const ir::StoragePlan& storage, const FusionLimits& limits, const Target& target, bool fuse) {
  std::string out;
  for (std::size_t i = 0; i < g.size(); ++i) {
    const auto v = static_cast<ir::ValueId>(i);
    const ir::StorageKind kind = storage[v].kind;
    if (storage.has_kernel(v) || kind == ir::StorageKind::input || kind == ir::StorageKind::reshape) continue;
    out += "// ---- %" + std::to_string(i) + " = " + std::string(ir::op_name(g.node(v).op)) + " : " + g.type_string(v) +
           " (no kernel: " + ir::no_kernel_reason(g, storage, v) + ")\n";
  }
  for (const KernelGroup& k : fuse ? plan_kernels(g, storage, limits) : unfused_kernels(g, storage)) {
    const Node& n = g.node(k.root);
    KernelSource source = k.fused() ? fused_source(g, storage, k, target) : kernel_source(g, storage, k.root, target);
    out += "// ---- %" + std::to_string(k.root) + " = " + std::string(ir::op_name(n.op)) + " : " + g.type_string(k.root) + " (kernel " + source.name +
           (k.fused() ? ", computing " + covered_nodes(g, k) : std::string()) +
           (k.beside >= 0 ? ", also storing %" + std::to_string(k.beside) + " " + std::string(ir::op_name(g.node(k.beside).op)) : std::string()) +
           ")\n" + source.glsl + "\n";
  }
  return out;
}

}  // namespace qkv::codegen
