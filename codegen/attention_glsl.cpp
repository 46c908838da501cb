// Flash-attention shaders. Each kernel gives a workgroup BR rows of one batch entry, RPT rows per
// invocation: the queries for the forward, its log-sum-exp, dq and the tangent, the keys for dk
// and dv. The row operands live in registers as vec4s (arrays sized by the head dims, which are
// specialization constants), and the other side streams through shared memory BC rows at a time;
// each vec4 read from a tile feeds RPT rows, 4 RPT multiply-adds. The geometry (INV invocations,
// RPT, BC) is chosen per device and kernel (Target, geometry()) and specialized, not written into
// the source: on lavapipe, whose shared-memory reads are loaded lane by lane, several rows per
// invocation (with one row and scalar reads the forward ran at 1.4 GFLOP/s, with 16 x 4 and vec4
// reads about 5, now 8 x 8); on a GPU 128 x 1, where more rows per invocation spill registers. The forward keeps a running max and sum
// per row (FlashAttention's online softmax), four keys at a time with their scores in a vec4, and
// rescales its accumulator only when a chunk raises the max (an array of a tile's scores lived in
// local memory on the H100: this doubled the forward there, and gave lavapipe 1.6x); the
// gradients recompute p = exp(s - lse) per tile from the forward's saved lse
// (FlashAttention-2), so nothing of size N x M is stored.
//
// Decoding on a GPU (1 to 16 queries per batch entry, which leave most invocations without a
// row), the forward takes its decode layout (DECODE): the invocations share the workgroup's rows
// and each streams keys of its own, their softmaxes merged at the end; past kDecodePartKeys keys
// the keys are split over workgroups too (SPLIT), the last part of a row block to finish merging
// the others' from a split buffer (flash-decoding in one dispatch: flash_decode_merge.glsl,
// decode_split).
//
// Flex attention's score modifier (ir/region.hpp) is emitted as a GLSL function of the scaled
// score and its query and key indices, `score_mod`, called where each score is formed; the
// tensors it reads are bound after the fixed operands and addressed per batch entry from which
// of the scores' dims they span (specialization constants, so one shader serves every length).
// dq and dk evaluate the modifier's forward-mode derivative with it (`score_mod_d`) and multiply
// ds by d mod / d score, as the cpu and the decomposition do; the tangent multiplies the scores'
// tangent by it.
//
// Masked scores follow the decomposition exactly: a masked p is 0, and 0 * inf or 0 * NaN in
// the products that follow is NaN. Causal and sliding-window tiles that are wholly masked, and
// tiles the modifier or a keep-mask masks whole (block sparsity: the ranges of the tensors it
// reads over the tile, gathered in shared memory, bound the region by interval arithmetic, as
// the cpu does with ir::bound_region), are skipped only after the workgroup has checked that the
// values they would have multiplied by those zeros are finite; otherwise it visits every tile.
// Each kernel adds the scores it computed to a 64-bit counter (Executable::tile_counts).
//
// The kernel and its parts are codegen/glsl/flash_*.glsl; this file chooses the parts and fills
// in what depends on the op, its operands and the device.
#include "codegen/attention_glsl.hpp"

#include <algorithm>
#include <bit>
#include <functional>
#include <optional>

#include "codegen/glsl_detail.hpp"
#include "codegen/glsl_files.hpp"
#include "codegen/push_constants.hpp"
#include "ir/bind.hpp"
#include "ir/error.hpp"
#include "ir/printer.hpp"
#include "ir/random.hpp"
#include "ir/region.hpp"

namespace qkv::codegen::detail {

namespace {

using ir::Node;
using ir::Op;
using ir::Shape;

constexpr int kMaxBatchRank = 4;  // 9 + 5 * 4 = 29 push-constant words, and the forward's split: 31
/// Up to two batch dims (batch and heads) the kernels also take row strides and the output's and
/// dy's batch strides (9 + 5 * 2 + 5 + 2 * 2 = 28 words, the forward 30), so they read heads in
/// place from a [B, N, H, D] projection and write [B, N, H, D] (attention_strided).
constexpr int kMostStridedBatchRank = 2;

/// The forward, its rows' log-sum-exp, its three gradients, and its tangent (forward mode).
enum class Kind { forward, lse, dq, dk, dv, jvp };

/// Invocations per workgroup and rows per invocation (BR = their product), per target and kind.
/// On lavapipe, which loads shared memory lane by lane, rows per invocation multiply what each
/// read feeds: the forward and lse take 8 x 8 (one SIMD-8 subgroup; at (1, 8, 128, 64) 11.4
/// GFLOP/s against 7.0 at 16 x 4), the gradients and the tangent 16 x 4, since with 8 rows LLVM
/// spends 4x as long compiling the gradients (6.3 s against 1.6 s for the five kernels) and 2.4x
/// the tangent (23 s against 10 s for Jvp.FusedAttentionTangentOnVulkan*'s kernels), which ran
/// at (1, 4, 512, 64) in 76 ms at 8 x 8 and 69-91 ms at 16 x 4 (medians of runs on a noisy machine). On a GPU 128 x 1, so a row's registers (q, the
/// output accumulator and, for dq, dy) stay within what an invocation has without spilling. Measured on an H100 at (1, 8, 4096, 64) with
/// QKV_VULKAN_ATTENTION_GEOMETRY: forward / forward + backward TFLOP/s 13.5 / 5.5 at 128 x 1 with 32-row tiles, 11.1 / 5.5 at 64 x 1, 6.1 / 3.8 at 64
/// x 1 with 64-row tiles (32 KiB of shared memory per workgroup: fewer resident), 3.2 / 2.4 at 64 x 2, 2.5 / 1.6 at 32 x 1.
struct Geometry {
  std::uint32_t invocations, rows_per_invocation;
};
Geometry geometry(const Target& t, Kind kind) {
  const bool rows_side = kind == Kind::forward || kind == Kind::lse;
  Geometry g = !t.cpu_device ? Geometry{128, 1} : rows_side ? Geometry{8, 8} : Geometry{16, 4};
  if (t.attention_invocations) g.invocations = t.attention_invocations;
  if (t.attention_rows) g.rows_per_invocation = t.attention_rows;
  return g;
}

Kind kind_of(const Node& n) {
  // Case lists (QKV_*_CASES, macros) clang-format cannot read:
  // clang-format off
  switch (n.op) {
    case Op::attention:
    case Op::masked_attention:
    case Op::flex_attention: return Kind::forward;
    case Op::attention_lse:
    case Op::masked_attention_lse:
    case Op::flex_attention_lse: return Kind::lse;
    case Op::attention_grad:
    case Op::masked_attention_grad:
    case Op::flex_attention_grad: return n.attrs.wrt == 0 ? Kind::dq : n.attrs.wrt == 1 ? Kind::dk : Kind::dv;
    QKV_ATTENTION_JVP_CASES return Kind::jvp;
    QKV_PRIMITIVE_CASES
    QKV_COMPOSITE_CASES break;
  }
  // clang-format on
  QKV_UNREACHABLE(std::string(ir::op_name(n.op)) + " is not fused attention");
}

bool masked(const Node& n) { return ir::attention_roles(n.op).mask >= 0; }

/// A flex node's tensor operands (those its score modifier reads), after its fixed operands.
std::size_t modifier_tensors(const Node& n) { return ir::is_flex_attention(n.op) ? ir::modifier_tensor_count(n.op, n.attrs, n.inputs.size()) : 0; }

/// The output's batch dims are the operands' broadcast batch dims, for every kind.
int batch_rank(const Node& n) { return n.shape.rank - 2; }

/// A buffer the kernel reads: its GLSL array, the offset of this workgroup's batch entry, and
/// its row width: a head dim (vec4 rows: D4 or DV4 vec4s, DR or DVR floats) or one float (lse
/// and delta).
struct Operand {
  const char* array;
  const char* tile;  // its shared tile when streamed
  const char* at;
  const char* vec4s;       // spec constant: vec4s per row, or nullptr for one float per row
  const char* real_width;  // the bound size in floats: DR, DVR or 1u
  const char* row_stride;  // elements between its rows (the width, or a head view's stride)
};

const Operand kQ{"Q", "q_tile", "q_at", "D4", "DR", "q_rs"}, kK{"K", "k_tile", "k_at", "D4", "DR", "k_rs"},
    kV{"V", "v_tile", "v_at", "DV4", "DVR", "v_rs"}, kDy{"DY", "dy_tile", "dy_at", "DV4", "DVR", "dy_rs"},
    kLse{"LSE", "lse_tile", "stat_at", nullptr, "1u", "1u"}, kDelta{"DELTA", "delta_tile", "stat_at", nullptr, "1u", "1u"};
/// The tangents of q, k and v (Kind::jvp): their primals' shapes, and (the tangent's kernel reads
/// no head views and no pages) their layout, so their primals' offsets and strides.
const Operand kTq{"TQ", "tq_tile", "q_at", "D4", "DR", "q_rs"}, kTk{"TK", "tk_tile", "k_at", "D4", "DR", "k_rs"},
    kTv{"TV", "tv_tile", "v_at", "DV4", "DVR", "v_rs"};

/// The operands each kind streams through shared memory (tiles of BC rows).
std::vector<Operand> streamed(Kind k) {
  switch (k) {
    case Kind::forward: return {kK, kV};
    case Kind::lse: return {kK};
    case Kind::dq: return {kK, kV};
    case Kind::dk: return {kQ, kDy, kLse, kDelta};
    case Kind::dv: return {kQ, kDy, kLse};
    case Kind::jvp: return {kK, kTk, kV, kTv};
  }
  return {};
}

/// Before skipping masked tiles: the streamed operands whose skipped rows, and the row operands
/// whose own rows, meet a masked zero in a product (see the file comment).
std::vector<Operand> checked_skipped(Kind k) {
  switch (k) {
    case Kind::forward: return {kV};  // y = sum p v
    case Kind::lse: return {};        // exp(-inf) is 0 whatever the operands hold
    case Kind::dq: return {kK, kV};   // dq = sum p (dy . v - delta) k
    case Kind::dk: return {kQ, kDy, kDelta};
    case Kind::dv: return {kDy};       // dv = sum p dy
    case Kind::jvp: return {kV, kTv};  // y = sum p v, y' = sum p (s' v + tv) - ...; a masked s' is 0
  }
  return {};
}
std::vector<Operand> checked_own(Kind k) {
  switch (k) {
    case Kind::dq: return {kDy, kDelta};
    case Kind::dk: return {kV};
    case Kind::forward:
    case Kind::lse:
    case Kind::dv:
    case Kind::jvp: return {};
  }
  return {};
}

std::string kind_name(Kind k) {
  switch (k) {
    case Kind::forward: return "forward";
    case Kind::lse: return "lse";
    case Kind::dq: return "dq";
    case Kind::dk: return "dk";
    case Kind::dv: return "dv";
    case Kind::jvp: return "jvp";
  }
  return "";
}

/// Floats of shared memory per streamed row, for head dims of d4 and dv4 vec4s.
std::int64_t tile_row_floats(Kind k, std::int64_t d4, std::int64_t dv4) {
  std::int64_t f = 0;
  for (const Operand& o : streamed(k)) f += !o.vec4s ? 1 : std::string(o.vec4s) == "D4" ? 4 * d4 : 4 * dv4;
  return f;
}

std::string str(std::int64_t v) { return std::to_string(v); }

/// The cooperative-matrix forward (GL_NV_cooperative_matrix), for attention whose q, k and v are
/// f16 values on a device with f16 fragments (Target::cooperative_matrix). A workgroup of
/// kCoopSubgroups subgroups takes CM query rows each; q's rows are staged once in shared memory
/// as f16 (exact: they are f16 values), and per tile of BC keys, k's and v's rows too. Each
/// subgroup forms its scores CN keys at a time (q k^T, fragments accumulated in f32 and stored to
/// shared memory), runs the online softmax on them in scalar code (every lane LPR-th of the
/// columns of RPL of the rows: the modifier, masks and dropout exactly as the scalar kernel), writes
/// p in f16 (as FlashAttention's f16 kernels and PyTorch's do: the one rounding the scalar kernel
/// does not have), and multiplies p v CN columns of v at a time, each product stored to shared
/// memory and added by its lanes to the output rows they keep in registers. A fragment's element
/// layout is opaque, which is why the rescale of the output by the softmax goes through those
/// registers rather than the accumulators. The forward's log-sum-exp (which training graphs run
/// beside it) takes the same kernel without p v, and dv the same with k's rows against tiles of
/// queries and dy (coop_body); dq and dk add a second product, dy v^T (coop_grad_body). Emulated
/// (Target::CooperativeMatrix::emulated), the fragment products are scalar code over the same
/// tiles, for devices without.
constexpr std::uint32_t kCoopSubgroups = 4;

/// Lanes per score row and rows per lane of a subgroup of `sg` over `m` rows (both 1 or more).
std::pair<std::uint32_t, std::uint32_t> coop_lanes(std::uint32_t sg, std::uint32_t m) {
  return sg >= m ? std::pair{sg / m, 1u} : std::pair{1u, m / sg};
}

/// Whether the target's fragment and subgroup suit the kernel: depth and columns divide the
/// 16-key steps, the lanes of a row divide a fragment's columns, and the emulation's elements
/// split evenly over the lanes.
bool coop_target(const Target& t) {
  const Target::CooperativeMatrix& cm = t.cooperative_matrix;
  const std::uint32_t sg = t.subgroup_size;
  if (cm.m == 0 || cm.n == 0 || cm.k == 0 || sg == 0 || 16 % cm.k != 0 || 16 % cm.n != 0) return false;
  const std::uint32_t lanes = coop_lanes(sg, cm.m).first;
  if ((sg >= cm.m ? sg % cm.m : cm.m % sg) != 0 || cm.n % lanes != 0 || cm.m * cm.n % sg != 0) return false;
  return kCoopSubgroups * sg <= t.max_invocations;
}

std::int64_t round_up(std::int64_t v, std::int64_t to) { return (v + to - 1) / to * to; }

/// Head dims padded to fragments: q and k's (KD) to the depth of the score product and, for dq
/// and dk, whose output is that wide, to the columns of the last; v's (KV) to the columns of p v,
/// and for dq and dk to the depth of dy v^T.
bool coop_grad(Kind kind) { return kind == Kind::dq || kind == Kind::dk; }
std::int64_t coop_kd(const Target& t, Kind kind, std::int64_t d4) {
  const Target::CooperativeMatrix& cm = t.cooperative_matrix;
  return round_up(4 * d4, coop_grad(kind) ? std::max(cm.k, cm.n) : cm.k);
}
std::int64_t coop_kv(const Target& t, Kind kind, std::int64_t dv4) {
  const Target::CooperativeMatrix& cm = t.cooperative_matrix;
  return round_up(4 * dv4, coop_grad(kind) ? cm.k : cm.n);
}

/// Shared memory of the cooperative kernel of `subgroups` subgroups with tiles of `bc` rows (the
/// layout in coop_declarations), and room for the flags and the tile tests' ranges.
std::int64_t coop_shared_bytes(const Target& t, Kind kind, std::int64_t subgroups, std::int64_t bc, std::int64_t d4, std::int64_t dv4) {
  const std::int64_t kd = coop_kd(t, kind, d4), kv = coop_kv(t, kind, dv4), br = subgroups * t.cooperative_matrix.m;
  std::int64_t bytes = 2 * (br + bc) * (kd + 8) + 2 * bc * (kv + 8) + 4 * br * (bc + 4) + 2 * br * (bc + 8) + 4 * bc + 512;
  if (coop_grad(kind)) bytes += 2 * br * (kv + 8) + 4 * bc;  // dy's (dk: v's) rows, the tile's delta
  return bytes;
}

/// The cooperative kernel's workgroup and streamed tile for these head dims: kCoopSubgroups
/// subgroups where their tiles fit in shared memory, else half as many (wide heads: the rows
/// staged once take most of it), with the largest tile of 64, 32 and 16 rows (at most the
/// target's override) that fits; {0, 0} where none does (then the kernel's scalar path runs).
struct CoopLaunch {
  std::int64_t subgroups = 0, bc = 0;
};
CoopLaunch coop_launch(const Target& t, Kind kind, std::int64_t d4, std::int64_t dv4) {
  for (std::int64_t subgroups : {std::int64_t{kCoopSubgroups}, std::int64_t{kCoopSubgroups / 2}})
    for (std::int64_t bc : {64, 32, 16})
      if ((t.attention_tile == 0 || bc <= t.attention_tile) && coop_shared_bytes(t, kind, subgroups, bc, d4, dv4) <= t.shared_bytes)
        return {subgroups, bc};
  return {};
}

/// The cooperative kernel's constants (`constants`) or its shared tiles and fragment products
/// (dv's with the tile's lse; dq's and dk's with the second rows, the tile's lse and delta, and
/// their products dy v^T and ds k).
std::string coop_declarations(const Target& t, bool constants, Kind kind) {
  const Target::CooperativeMatrix& cm = t.cooperative_matrix;
  const auto [lanes, rows] = coop_lanes(t.subgroup_size, cm.m);
  const auto u = [](std::uint32_t v) { return std::to_string(v) + "u"; };
  const bool grad = coop_grad(kind), dv = kind == Kind::dv;
  std::string s = "const uint CM = " + u(cm.m) + ", CN = " + u(cm.n) + ", CK = " + u(cm.k) + ";  // the device's fragment: CM x CK times CK x CN\n";
  s += "const uint SG = " + u(t.subgroup_size) + ", NSG = gl_WorkGroupSize.x / SG;  // invocations per subgroup, subgroups (chosen at launch)\n";
  s += "const uint LPR = " + u(lanes) + ", RPL = " + u(rows) + ";  // lanes per score row, rows per lane\n";
  if (grad) {
    s += "const uint KP = CK > CN ? CK : CN;  // q and k's head dim is the score product's depth and ds k's columns\n";
    s += "const uint KD = (4u * D4 + KP - 1u) / KP * KP, KV = (4u * DV4 + CK - 1u) / CK * CK;  // head dims, padded to fragments\n";
  } else {
    s += "const uint KD = (4u * D4 + CK - 1u) / CK * CK, KV = (4u * DV4 + CN - 1u) / CN * CN;  // head dims, padded to fragments\n";
  }
  s += "const uint QS = KD + 8u, VS = KV + 8u, SS = BC + 4u, PS = BC + 8u;  // shared row strides, padded to 16 bytes\n";
  if (constants) return s;
  s = "// Sized 1 when the scalar path runs.\n"
      "shared float16_t rows_s[COOP * NSG * CM * QS + 1u - COOP];  // the workgroup's rows: queries (dv, dk: keys)\n"
      "shared float16_t tile_s[COOP * BC * QS + 1u - COOP];        // the tile's keys (dv, dk: queries)\n"
      "shared float16_t vals_s[COOP * BC * VS + 1u - COOP];        // the tile's v (dv, dk: dy)\n"
      "shared float s_s[COOP * NSG * CM * SS + 1u - COOP];     // per subgroup: its scores, then a product\n"
      "shared float16_t p_s[COOP * NSG * CM * PS + 1u - COOP];  // per subgroup: its p (dq, dk: ds)\n" +
      std::string(grad ? "shared float16_t rows2_s[COOP * NSG * CM * VS + 1u - COOP];  // the workgroup's dy rows (dk: v)\n" : "") +
      std::string(dv || kind == Kind::dk ? "shared float lse_s[COOP * BC + 1u - COOP];  // the tile's queries' lse\n" : "") +
      std::string(kind == Kind::dk ? "shared float delta_s[COOP * BC + 1u - COOP];  // and their delta\n" : "") + "\n";
  // Fragment products into s_s: a subgroup's CM rows of a row-major A (`a`, row stride `as`)
  // times CK-deep steps of B (`b`, row stride `bs`; transposed: B's columns are b's rows), `depth`
  // deep, for output columns c..c + CN (at column `at` of s_s).
  auto product = [&](const char* name, const char* comment, const char* a, const char* as, const char* b, const char* bs, bool transposed,
                     const char* depth, const char* at) {
    const std::string b_at = transposed ? "c * " + std::string(bs) + " + kk" : "kk * " + std::string(bs) + " + c";
    const std::string b_element = std::string(b) + (transposed ? "[n * " + std::string(bs) + " + kk]" : "[kk * " + std::string(bs) + " + n]");
    return glsl_template(cm.emulated ? "flash_coop_product_emulated.glsl" : "flash_coop_product.glsl", {{"NAME", name},
                                                                                                        {"COMMENT", comment},
                                                                                                        {"A", a},
                                                                                                        {"AS", as},
                                                                                                        {"B", b},
                                                                                                        {"BS", bs},
                                                                                                        {"D", depth},
                                                                                                        {"AT", at},
                                                                                                        {"BAT", b_at},
                                                                                                        {"TR", transposed ? "true" : "false"},
                                                                                                        {"BEL", b_element}});
  };
  if (cm.emulated)
    s += "// Emulated fragments: invocation `lane` of the subgroup computes elements lane + j SG of each.\nconst uint EL = CM * CN / SG;\n";
  s += product("score_chunk", "Scores of subgroup sg's rows by tile rows c..c + CN (q k^T; dv, dk: k q^T), into s_s.", "rows_s", "QS", "tile_s", "QS",
               true, "KD", "c");
  if (grad) {
    s += product("dp_chunk", "dy v^T (dk: v dy^T) of subgroup sg's rows by tile rows c..c + CN, into s_s.", "rows2_s", "VS", "vals_s", "VS", true,
                 "KV", "c");
    s += product("pv_chunk", "ds k (dk: ds q) for subgroup sg's rows, columns c..c + CN, into s_s's first CN columns.", "p_s", "PS", "tile_s", "QS",
                 false, "BC", "0u");
  } else if (kind != Kind::lse) {
    s += product("pv_chunk", "p v (dv: p dy) for subgroup sg's rows, columns c..c + CN, into s_s's first CN columns.", "p_s", "PS", "vals_s", "VS",
                 false, "BC", "0u");
  }
  return s + "\n";
}

/// `text` with `by` before each of its lines (a block nested one level deeper).
std::string indented(const std::string& text, const std::string& by) {
  std::string out;
  for (std::size_t at = 0; at < text.size();) {
    const std::size_t end = std::min(text.find('\n', at), text.size() - 1) + 1;
    out += by + text.substr(at, end - at);
    at = end;
  }
  return out;
}

/// Rows `first` + row of an operand (`read`: its row4_ reader) staged in `array` as f16 (exact:
/// f16 values), `count` rows of `width` (a fragment multiple), zeros where `in` is false and
/// past the head dim's `vec4s`.
std::string coop_stage(const std::string& array, const std::string& count, const std::string& width, const std::string& stride,
                       const std::string& vec4s, const std::string& in, const std::string& read, const std::string& first,
                       const std::string& indent) {
  return indented(
      glsl_template("flash_coop_stage.glsl",
                    {{"COUNT", count}, {"W", width}, {"IN", in}, {"G", vec4s}, {"READ", read}, {"FIRST", first}, {"A", array}, {"S", stride}}),
      indent);
}

/// The loop that adds subgroup sg's products (pv_chunk) to the output rows its lanes keep in `o`
/// (`width` columns, padded), CN columns at a time through s_s, each times `factor` (GLSL after
/// the product, or empty).
std::string coop_accumulate(const std::string& what, const std::string& width, const std::string& factor) {
  return glsl_template("flash_coop_accumulate.glsl", {{"WHAT", what}, {"W", width}, {"FACTOR", factor}});
}

/// The cooperative kernel's part of main, from the row operands to the stores (`skip`: the
/// tile test, `counts`: the tile count's update, `stored`: an output value as stored). The
/// forward: q's rows against tiles of keys, the online softmax, p v. Its log-sum-exp: the same
/// without p v. dv: k's rows against tiles of queries, p = exp(s - lse) from the forward's saved
/// lse (FlashAttention-2's backward, no rescaling), dv += p dy.
std::string coop_body(const Target& t, Kind kind, bool modifier, bool drop, bool sink, const std::string& skip, const std::string& counts,
                      const std::function<std::string(const std::string&)>& stored) {
  const bool forward = kind == Kind::forward, lse = kind == Kind::lse, dv = kind == Kind::dv;
  const std::uint32_t lanes = coop_lanes(t.subgroup_size, t.cooperative_matrix.m).first;
  // A row's index is `own` (a query, or dv's key), a tile column's `other`.
  const GlslValues names = {{"ROWREAD", dv ? "row4_K" : "row4_Q"},
                            {"TILEREAD", dv ? "row4_Q" : "row4_K"},
                            {"VALREAD", dv ? "row4_DY" : "row4_V"},
                            {"OWNCOUNT", dv ? "M" : "N"},
                            {"OWN", dv ? "kj" : "qi"},
                            {"OTHER", dv ? "qi" : "kj"}};
  const auto& stage = coop_stage;
  std::string s =
      "  uint sg = gl_SubgroupID, sub = gl_SubgroupInvocationID % LPR;\n"
      "  uint wr0 = sg * CM + gl_SubgroupInvocationID / LPR;  // this lane's first row in the workgroup; the others SG / LPR apart\n"
      "  // The rows once, zeros past the last.\n" +
      stage("rows_s", "NSG * CM", "KD", "QS", "D4", fill_glsl("r0 + row < $OWNCOUNT", names), fill_glsl("$ROWREAD", names), "r0", "  ");
  if (!dv)
    s += "  float m[RPL], l[RPL];  // per row: the running max, and this lane's part of the sum of exp(s - m)\n"
         "  [[unroll]] for (uint i = 0u; i < RPL; ++i) { m[i] = neg_inf(); l[i] = 0.0; }\n";
  if (!lse)
    s += "  float o[RPL * (KV / LPR)];  // per row: this lane's columns of the output, sub + j LPR of each CN\n"
         "  [[unroll]] for (uint x = 0u; x < RPL * (KV / LPR); ++x) o[x] = 0.0;\n";
  s += "  for (uint t0 = lo; t0 < hi; t0 += BC) {\n    uint cols = min(BC, hi - t0);\n" + skip +
       "    visited += rows * cols;\n"
       "    barrier();  // everyone is done with the previous tiles\n";
  s += stage("tile_s", "BC", "KD", "QS", "D4", "row < cols", fill_glsl("$TILEREAD", names), "t0", "    ");
  if (!lse) s += stage("vals_s", "BC", "KV", "VS", "DV4", "row < cols", fill_glsl("$VALREAD", names), "t0", "    ");
  if (dv) s += "    for (uint x = lid; x < BC; x += INV) lse_s[x] = x < cols ? LSE[stat_at + t0 + x] : 0.0;\n";
  s += "    barrier();\n"
       "    for (uint c = 0u; c < BC; c += CN) score_chunk(sg, c);\n"
       "    subgroupMemoryBarrierShared();\n"
       "    subgroupBarrier();\n";
  const std::string score = modifier ? "score_mod(s_s[wr * SS + c] * scale, qi, kj)" : "s_s[wr * SS + c] * scale";
  if (dv) {
    s += glsl_template("flash_coop_dv_weights.glsl",
                       {{"SCORE", score}, {"DROP", drop ? "        if (c < cols && kj < M) p *= dropout_factor(qi, kj);  // dv = (p z)T dy\n" : ""}});
  } else {
    s += glsl_template(
        "flash_coop_online_softmax.glsl",
        {{"SCORE", score},
         {"SHUFFLEMAX", lanes > 1 ? "      for (uint w = 1u; w < LPR; w *= 2u) mx = qkv_max(mx, subgroupShuffleXor(mx, w));\n" : ""},
         {"ORESCALE", lse ? "" : "        [[unroll]] for (uint x = 0u; x < KV / LPR; ++x) o[i * (KV / LPR) + x] *= alpha;\n"},
         {"PWRITE",
          lse ? ""
              : std::string(drop ? "        if (c < cols && qi < N) p *= dropout_factor(qi, t0 + c);  // the sum normalises the undropped weights\n"
                                 : "") +
                    "        p_s[wr * PS + c] = float16_t(p);\n"}});
  }
  if (!lse) s += "    subgroupMemoryBarrierShared();\n    subgroupBarrier();\n" + coop_accumulate("o += p v (dv: p dy)", "KV", "");
  s += "  }\n";
  if (!dv && lanes > 1)
    s += "  [[unroll]] for (uint i = 0u; i < RPL; ++i)\n    for (uint w = 1u; w < LPR; w *= 2u) l[i] += subgroupShuffleXor(l[i], w);\n";
  s += counts;
  if (sink)
    s += glsl_template("flash_sink_fold.glsl",
                       {{"ROWS", "RPL"},
                        {"ROW", "(r0 + wr0 + t * (SG / LPR))"},
                        {"O", lse ? "" : "    [[unroll]] for (uint x = 0u; x < KV / LPR; ++x) o[t * (KV / LPR) + x] *= c;\n"}});
  if (lse) {
    s += "  [[unroll]] for (uint i = 0u; i < RPL; ++i) {  // -inf for a row with no key; one lane of each row writes it\n"
         "    uint qi = r0 + wr0 + i * (SG / LPR);\n"
         "    if (qi < N && sub == 0u) OUT[out_at + qi] = " +
         stored("(m[i] == neg_inf() ? 0.0 : m[i]) + qkv_log(l[i])") + ";\n  }\n";
  } else {
    s += glsl_template("flash_coop_store.glsl",
                       {{"NOTE", forward ? "  // A row with no key has l = 0 and o = a sum of 0 * v: zeros, or NaN where v holds inf or NaN.\n" : ""},
                        {"OWN", dv ? "kj" : "qi"},
                        {"OWNCOUNT", dv ? "M" : "N"},
                        {"STORED", stored(forward ? "l[i] == 0.0 ? y : y / l[i]" : "y")}});
  }
  return s;
}

/// dq and dk on cooperative matrices (FlashAttention-2's backward): the workgroup's rows of q and
/// dy (dk: k and v) staged once, tiles of k and v (dk: q and dy, with their lse and delta). Per
/// tile each subgroup forms dp = dy v^T (dk: v dy^T), which its lanes read into registers, then
/// the scores; each lane computes ds = p (z dp - delta) (times the modifier's derivative),
/// p = exp(s - lse) from the forward's lse, exactly as the scalar kernel, and writes it in f16
/// (as FlashAttention's f16 backward does); ds k (dk: ds q) is added CN columns at a time to the
/// rows each lane keeps in registers, and scaled once at the end.
std::string coop_grad_body(const Target& t, Kind kind, bool modifier, bool drop, const std::string& skip, const std::string& counts,
                           const std::function<std::string(const std::string&)>& stored) {
  const bool dk = kind == Kind::dk;
  const std::uint32_t lanes = coop_lanes(t.subgroup_size, t.cooperative_matrix.m).first;
  // A row's index is `own` (a query, or dk's key), a tile column's `other`.
  GlslValues names = {{"ROWREAD", dk ? "row4_K" : "row4_Q"},
                      {"ROW2READ", dk ? "row4_V" : "row4_DY"},
                      {"TILEREAD", dk ? "row4_Q" : "row4_K"},
                      {"VALREAD", dk ? "row4_DY" : "row4_V"},
                      {"OWNCOUNT", dk ? "M" : "N"},
                      {"OWN", dk ? "kj" : "qi"},
                      {"OTHER", dk ? "qi" : "kj"},
                      {"LSE", dk ? "lse_s[c]" : "lse_r[i]"},
                      {"DELTA", dk ? "delta_s[c]" : "delta_r[i]"}};
  std::string s =
      "  uint sg = gl_SubgroupID, sub = gl_SubgroupInvocationID % LPR;\n"
      "  uint wr0 = sg * CM + gl_SubgroupInvocationID / LPR;  // this lane's first row in the workgroup; the others SG / LPR apart\n"
      "  // The rows once, zeros past the last.\n" +
      coop_stage("rows_s", "NSG * CM", "KD", "QS", "D4", fill_glsl("r0 + row < $OWNCOUNT", names), fill_glsl("$ROWREAD", names), "r0", "  ") +
      coop_stage("rows2_s", "NSG * CM", "KV", "VS", "DV4", fill_glsl("r0 + row < $OWNCOUNT", names), fill_glsl("$ROW2READ", names), "r0", "  ");
  if (!dk)
    s += "  float lse_r[RPL], delta_r[RPL];  // per row\n"
         "  [[unroll]] for (uint i = 0u; i < RPL; ++i) {\n"
         "    uint qi = r0 + wr0 + i * (SG / LPR);\n"
         "    lse_r[i] = qi < N ? LSE[stat_at + qi] : 0.0;\n"
         "    delta_r[i] = qi < N ? DELTA[stat_at + qi] : 0.0;\n"
         "  }\n";
  s += "  float o[RPL * (KD / LPR)];  // per row: this lane's columns of the output, sub + j LPR of each CN\n"
       "  [[unroll]] for (uint x = 0u; x < RPL * (KD / LPR); ++x) o[x] = 0.0;\n"
       "  for (uint t0 = lo; t0 < hi; t0 += BC) {\n    uint cols = min(BC, hi - t0);\n" +
       skip +
       "    visited += rows * cols;\n"
       "    barrier();  // everyone is done with the previous tiles\n" +
       coop_stage("tile_s", "BC", "KD", "QS", "D4", "row < cols", fill_glsl("$TILEREAD", names), "t0", "    ") +
       coop_stage("vals_s", "BC", "KV", "VS", "DV4", "row < cols", fill_glsl("$VALREAD", names), "t0", "    ");
  if (dk)
    s += "    for (uint x = lid; x < BC; x += INV) {\n"
         "      lse_s[x] = x < cols ? LSE[stat_at + t0 + x] : 0.0;\n"
         "      delta_s[x] = x < cols ? DELTA[stat_at + t0 + x] : 0.0;\n"
         "    }\n";
  const std::string modified = !modifier ? ""
                                         : "          float dmod = 0.0;\n"
                                           "          if ($OWN < $OWNCOUNT) { vec2 md = score_mod_d(sc, qi, kj); sc = md.x; dmod = md.y; }\n";
  names.insert(names.end(),
               {{"MODIFIED", fill_glsl(modified, names)},
                {"ACCUMULATE", coop_accumulate("o += ds k (dk: ds q)", "KD", " * unscale[i]")},
                {"SHUFFLEMAX", lanes > 1 ? "      for (uint w = 1u; w < LPR; w *= 2u) big = qkv_max(big, subgroupShuffleXor(big, w));\n" : ""},
                {"DROP", drop ? " * dropout_factor(qi, kj)" : ""},
                {"DMOD", modifier ? " * dmod" : ""}});
  s += glsl_template("flash_coop_grad_tile.glsl", names);
  s += counts;
  s += glsl_template("flash_coop_grad_store.glsl", {{"OWNCOUNT", dk ? "M" : "N"}, {"STORED", stored("y")}});
  return s;
}
}  // namespace

bool attention_fits(const Node& n) {
  // The modifier's tensor gradients are score-shaped (they are summed over broadcast dims after):
  // the decomposition computes those.
  if (n.op == Op::flex_attention_grad && n.attrs.wrt > 2) return false;
  return batch_rank(n) <= kMaxBatchRank;
}

bool attention_splits_keys(const Node& n) { return ir::is_fused_attention(n.op) && kind_of(n) == Kind::forward; }

// The tangent's six row operands would need six sets of strides (more push constants than the
// 128 bytes every device has): it reads contiguous rows, its tangents laid out as their primals.
bool attention_strided(const Node& n) {
  return ir::is_fused_attention(n.op) && !ir::attention_roles(n.op).jvp() && batch_rank(n) <= kMostStridedBatchRank;
}

bool packed_sequences(const ir::Graph& g, const Node& n) {
  return ir::has_document_mask(n, [&](ir::ValueId x) -> const Shape& { return g.node(x).shape; });  // the static dims
}

bool attention_cooperative(const ir::Graph& g, const ir::StoragePlan& storage, ir::ValueId v, const Target& target) {
  const Node& n = g.node(v);
  if (!ir::is_fused_attention(n.op) || !coop_target(target)) return false;
  if (target.deterministic && packed_sequences(g, n)) return false;  // fragment sums group keys by packed position
  // The operands multiplied in fragments: q and k, then v (the forward) or dy (dv), or both (dq
  // and dk: dy v^T, then ds times k or q).
  std::vector<std::size_t> multiplied = {0, 1};
  switch (kind_of(n)) {
    case Kind::forward: multiplied.push_back(2); break;
    case Kind::lse: break;
    case Kind::dv: multiplied.push_back(3); break;
    case Kind::dq:
    case Kind::dk: multiplied.insert(multiplied.end(), {2, 3}); break;
    case Kind::jvp: return false;  // scalar only
  }
  return std::all_of(multiplied.begin(), multiplied.end(), [&](std::size_t k) { return storage[n.inputs[k]].f16_numbers; });
}

/// The flash kernels' specialization constants, declared once for the shader and its launch: the
/// head dims in vec4s, the tile height, the workgroup's invocations, rows per invocation, the
/// switch to the cooperative-matrix path (1 where a kernel built with one has its tiles fit the
/// device's shared memory for the bound head dims; the rest ignore it), and which of the scores'
/// dims each modifier tensor spans.
SpecConstants attention_spec_constants(const Node& n, Paging paging) {
  SpecConstants c;
  c.constant("D4", 1, "q and k's head dim in vec4s (rounded up)")
      .constant("DV4", 1, "v's head dim in vec4s")
      .constant("BC", 1, "streamed rows per shared tile")
      .local_size("INV invocations, chosen per device")
      .constant("RPT", 1, "rows per invocation, chosen per device")
      .constant("COOP", 0, "1: the cooperative-matrix path (its tiles fit), where the kernel has one");
  if (kind_of(n) == Kind::forward)
    c.constant("DECODE", 0, "1: the decode layout (the invocations share RPT rows, each keys of its own)")
        .constant("SPLIT", 0, "1: the keys split over pc.parts workgroups, the last merging them");
  for (std::size_t i = 0; i < modifier_tensors(n); ++i) {
    const std::string t = std::to_string(i);
    c.constant("T" + t + "_DIMS", 0, "the scores' dims t" + t + " spans (bit d: dim d)");
  }
  if (ir::has_sink(n.op, n.attrs)) c.constant("SINK_DIMS", 0, "the scores' dims the sink logits span (bit d: dim d)");
  for (const auto& [paged, a] : {std::pair{paging.k, std::string("K")}, std::pair{paging.v, std::string("V")}})
    if (paged)
      c.constant(a + "_PAGE", 1, "rows per page of " + a + "'s cache")
          .constant(a + "_POOL", 0, "the pages in " + a + "'s pool (other table entries read zeros)")
          .constant(a + "_PAGE_ELEMS", 0, "elements per page of " + a + "'s cache: its heads' rows");
  return c;
}

PushConstants attention_push_constants(const Node& n) {
  using T = PushConstants::Type;
  const int r = batch_rank(n);
  PushConstants p;
  p.scalar("queries", T::u32, "N")
      .scalar("keys", T::u32, "M")
      .scalar("head_dim", T::u32, "D: q's and k's row width")
      .scalar("value_dim", T::u32, "Dv: v's and dy's row width (0 for the log-sum-exp)")
      .scalar("scale", T::f32, "what the scores are multiplied by")
      .scalar("shift", T::i32, "causal: query i keeps keys j <= i + shift")
      .scalar("window", T::i32, "causal: only the last `window` of those (0: all)")
      .scalar("mask_row_stride", T::u32, "the keep-mask's stride along queries (0: broadcast)")
      .scalar("mask_col_stride", T::u32, "and along keys")
      .array("batch", r, "the batch dims' sizes")
      .array("q_batch_strides", r, "elements between batch entries, per batch dim (0: broadcast)")
      .array("k_batch_strides", r, "")
      .array("v_batch_strides", r, "")
      .array("mask_batch_strides", r, "");
  if (kind_of(n) == Kind::forward)
    p.scalar("parts", T::u32, "the workgroups a row block's keys are split over (1: none)").scalar("part_keys", T::u32, "keys per part");
  if (attention_strided(n))  // heads read and written in place through strides
    p.scalar("q_row_stride", T::u32, "elements between rows")
        .scalar("k_row_stride", T::u32, "")
        .scalar("v_row_stride", T::u32, "")
        .scalar("dy_row_stride", T::u32, "")
        .scalar("out_row_stride", T::u32, "")
        .array("dy_batch_strides", r, "")
        .array("out_batch_strides", r, "");
  return p;
}

int attention_push_words(const Node& n) { return attention_push_constants(n).words(); }

namespace {

/// A flash kernel's operand whose range over a tile decides block sparsity: the buffer, this
/// batch entry's offset, its query and key strides.
struct Ranged {
  std::string array, at, row, col;
};

/// What the sections of a flash kernel's source (attention_source) share: the node's facts as
/// its GLSL names them.
struct Flash {
  Flash(const Node& node, const std::vector<DType>& held_dtypes, DType out, DType rounded_to, const Target* coop_target, Paging paged,
        Beside with_forward, bool packed_sequences);
  const Node& n;
  const std::vector<DType>& held;
  DType out_dtype, rounded;
  /// The forward with cooperative matrices beside its scalar path (coop_declarations), or null.
  const Target* cooperative;
  Kind kind;
  bool coop, causal, mask, drop;
  bool sink = false;  // attention sinks: a logit per row joins the softmax (the forward, lse and tangent)
  bool key_rows;      // rows are keys, streaming queries
  bool tangent;       // Kind::jvp: the tangents of q, k and v beside them
  bool decode;        // the forward: its decode layout and key split (DECODE, flash_decode_merge.glsl)
  bool packed;        // over packed sequences: the online softmax takes its keys one at a time (*_keys.glsl)
  bool strided;
  Paging paging;  // keys and values read through block tables (KTABLE, VTABLE)
  Beside beside;  // the tangent: the forward's output, written too (binding OUTY)
  int r;
  std::string own_count, other_count, out_width, out_count;
  std::vector<std::string> arrays;  // the bindings' names, the node's operands in order
  std::size_t tensors = 0;          // the modifier's
  bool with_derivative = false;     // dq, dk and the tangent need the modifier's derivative
  std::vector<std::pair<ir::ValueId, bool>> masking;
  std::optional<ir::Graph> modifier;  // the region, differentiated where with_derivative
  bool region_skips = false, tests_tiles = false;
  std::vector<Ranged> ranged;
  /// q, k, v and dy or the tangents, and the sink logits, may be held in 16 bits (f16 as
  /// float16_t, bf16 as the high half of an f32).
  DType held_in(std::size_t i) const { return i < held.size() && (i < (tangent ? 6u : 4u) || arrays[i] == "SINK") ? held[i] : DType::f32; }
};

Flash::Flash(const Node& node, const std::vector<DType>& held_dtypes, DType out, DType rounded_to, const Target* coop_target, Paging paged,
             Beside with_forward, bool packed_sequences)
    : n(node), held(held_dtypes), out_dtype(out), rounded(rounded_to), cooperative(coop_target), kind(kind_of(node)), coop(coop_target != nullptr),
      causal(node.attrs.causal), mask(masked(node)), drop(ir::has_dropout_seed(node.op, node.attrs)), key_rows(kind == Kind::dk || kind == Kind::dv),
      tangent(kind == Kind::jvp), decode(kind == Kind::forward), packed(packed_sequences), strided(attention_strided(node)), paging(paged),
      beside(kind == Kind::jvp ? with_forward : Beside{}), r(batch_rank(node)), own_count(key_rows ? "M" : "N"), other_count(key_rows ? "N" : "M"),
      out_count(own_count) {
  // The output's rows: the forward's, the tangent's and dv's are Dv wide, dq's and dk's D, the
  // lse's one float.
  out_width = kind == Kind::lse ? "1u" : kind == Kind::forward || kind == Kind::dv || tangent ? "DVR" : "DR";

  // Bindings: the node's operands in order, then the output.
  arrays = kind == Kind::forward ? std::vector<std::string>{"Q", "K", "V"}
           : kind == Kind::lse   ? std::vector<std::string>{"Q", "K"}
           : tangent             ? std::vector<std::string>{"Q", "K", "V", "TQ", "TK", "TV"}
                                 : std::vector<std::string>{"Q", "K", "V", "DY", "LSE", "DELTA"};
  if (mask) arrays.emplace_back("KEEP");
  tensors = modifier_tensors(n);
  for (std::size_t i = 0; i < tensors; ++i) arrays.push_back("T" + str(static_cast<std::int64_t>(i)));
  sink = ir::has_sink(n.op, n.attrs);
  if (sink) arrays.emplace_back("SINK");        // the sink logits, after the modifier's tensors
  if (drop) arrays.emplace_back("SEED");        // dropout's seed, the last operand
  if (paging.k) arrays.emplace_back("KTABLE");  // the block tables, after the node's operands
  if (paging.v) arrays.emplace_back("VTABLE");
  // The score modifier: a function of the scaled score and its indices, reading the tensors T<i>
  // at offsets set per batch entry from which of the scores' dims each spans (a specialization
  // constant: the sizes come from the push constants). dq, dk and the tangent also need its
  // derivative.
  with_derivative = kind == Kind::dq || kind == Kind::dk || tangent;
  // A tile whose masking conditions provably keep every score runs the modifier without them
  // (FlexAttention's full blocks): tile_masked sets tile_unmasked, and score_mod dispatches.
  masking = n.region ? ir::masking_conditions(*n.region) : std::vector<std::pair<ir::ValueId, bool>>{};
  if (n.region) modifier = with_derivative ? ir::differentiate_region(*n.region, ir::kRegionScore, true) : *n.region;
  // Block sparsity: a tile is skipped when every score in it is masked whatever the scores are.
  // The modifier's tensors (and a keep-mask) laid out along the queries or the keys only are
  // reduced to their ranges over the tile's rows in shared memory, and the region is bounded
  // from them and the tile's index ranges by interval arithmetic (ir::bound_region's rules); a
  // keep-mask that is 0 over the tile drops it too. Three slots of ranges rotate so that one
  // barrier per tile separates gathering, reading and clearing.
  region_skips = n.region && ir::region_masks(*n.region);
  tests_tiles = region_skips || mask;
  if (region_skips)
    for (std::size_t i = 0; i < tensors; ++i) {
      const std::string t = str(static_cast<std::int64_t>(i));
      ranged.push_back({"T" + t, "t" + t + "_at", "t" + t + "_row", "t" + t + "_col"});
    }
  if (mask) ranged.push_back({"KEEP", "mask_at", "pc.mask_row_stride", "pc.mask_col_stride"});
}

/// dot[t] = row t . tile row c (the score before scaling); `a` the registers, `tile` the tile.
/// `at`: where tile row c's vec4 g lies (the forward's tiles are transposed when decoding: tile_at).
std::string dots(const char* out, const char* a, const char* tile, const char* g, const std::string& at = "") {
  return glsl_template("flash_dots.glsl",
                       {{"OUT", out}, {"A", a}, {"TILE", tile}, {"G", g}, {"AT", at.empty() ? "c * " + std::string(g) + " + g" : at}});
}

/// The statement that skips a tile tile_masked finds masked, where tiles are tested.
std::string flash_skip(const Flash& f) {
  return !f.tests_tiles ? ""
         : f.key_rows   ? "    if (may_skip && tile_masked(t0, t0 + cols - 1u, r0, r0 + rows - 1u)) continue;\n"
                        : "    if (may_skip && tile_masked(r0, r0 + rows - 1u, t0, t0 + cols - 1u)) continue;\n";
}

/// The scores this workgroup computed, added to a 64-bit count as two words.
std::string flash_counts() {
  return "  if (lid == 0u && visited > 0u) {\n"
         "    uint before = atomicAdd(COUNTS[0], visited);\n"
         "    if (before + visited < before) atomicAdd(COUNTS[1], 1u);  // the low word wrapped\n"
         "  }\n";
}

/// The buffers: the node's operands in order, each in the dtype it is held in, then the output (a
/// tangent's, and the forward's it writes too: OUTY) and the tile counts, and for the forward its
/// split buffer.
std::string flash_bindings(const Flash& f) {
  const std::vector<std::string>& arrays = f.arrays;
  const DType out_dtype = f.out_dtype;
  std::string bindings;
  for (std::size_t i = 0; i < arrays.size(); ++i) {
    const DType t = f.held_in(i);
    const char* element = held_element(t);
    bindings += "layout(std430, binding = " + str(static_cast<std::int64_t>(i)) + ") readonly buffer B" + arrays[i] + " { " + element + " " +
                arrays[i] + "[]; };\n";
  }
  bindings += "layout(std430, binding = " + str(static_cast<std::int64_t>(arrays.size())) + ") writeonly buffer BOUT { " +
              std::string(held_element(out_dtype)) + " OUT[]; };\n";
  const std::int64_t counts = static_cast<std::int64_t>(arrays.size()) + (f.beside.on ? 2 : 1);
  if (f.beside.on)
    bindings += "layout(std430, binding = " + str(counts - 1) + ") writeonly buffer BOUTY { " + std::string(held_element(f.beside.out)) +
                " OUTY[]; };  // the forward's output\n";
  bindings += "layout(std430, binding = " + str(counts) + ") buffer BCOUNTS { uint COUNTS[]; };  // scores in the tiles computed: low, high word\n";
  if (f.decode)
    bindings += "layout(std430, binding = " + str(static_cast<std::int64_t>(arrays.size()) + 2) +
                ") coherent buffer BPARTIALS { uint PARTIALS[]; };  // keys split over workgroups: arrivals, then the parts' rows\n";
  return bindings;
}

/// Shared tiles, and a reader per head-dim operand: elements 4g..4g+3 of a row, 0 past its end.
std::pair<std::string, std::string> flash_tiles_and_readers(const Flash& f) {
  const Kind kind = f.kind;
  const bool coop = f.coop;
  const std::vector<std::string>& arrays = f.arrays;
  std::string tiles, readers;
  // 16 bytes when the cooperative path runs (a vec4, four floats: see nonfinite).
  const std::string scalar_only = coop ? "(1u - COOP) * " : "", sized_one = coop ? " + COOP" : "", sized_four = coop ? " + 4u * COOP" : "";
  for (const Operand& o : streamed(kind))
    tiles += o.vec4s ? std::string("shared vec4 ") + o.tile + "[" + scalar_only + "BC * " + o.vec4s + sized_one + "];\n"
                     : std::string("shared float ") + o.tile + "[" + scalar_only + "BC" + sized_four + "];\n";
  for (const Operand& o : {kQ, kK, kV, kDy, kLse, kDelta, kTq, kTk, kTv}) {
    const auto slot = static_cast<std::size_t>(std::find(arrays.begin(), arrays.end(), o.array) - arrays.begin());
    if (slot == arrays.size()) continue;
    const DType t = f.held_in(slot);
    // load_$A: an element as f32 (a 16-bit one widened exactly).
    const std::string e = std::string(o.array) + "[i]";
    readers += "float load_" + std::string(o.array) + "(uint i) { return " + widened(t, e) + "; }\n";
    const std::string a = o.array;
    if ((a == "K" && f.paging.k) || (a == "V" && f.paging.v))
      readers += glsl_template("flash_paged_row.glsl", {{"AT", o.at}, {"A", a}, {"RS", o.row_stride}, {"TAB", a == "K" ? "k_table" : "v_table"}});
    else readers += "bool row_at_" + a + "(uint row, out uint at) { at = " + o.at + " + row * " + o.row_stride + "; return true; }\n";
    if (!o.vec4s) continue;
    readers += glsl_template("flash_row_reader.glsl", {{"A", o.array}, {"W", o.real_width}});
  }
  return {tiles, readers};
}

/// The score modifier's text: its tensors' globals, per-batch offsets and strides (their dims are
/// specialization constants: attention_spec_constants), and its functions (score_mod, or score_mod_d with its derivative).
struct ModifierText {
  std::string globals, functions, at, strides;
};

ModifierText flash_modifier(const Flash& f) {
  const Node& n = f.n;
  const std::size_t tensors = f.tensors;
  const bool with_derivative = f.with_derivative;
  const auto& masking = f.masking;
  const std::optional<ir::Graph>& modifier = f.modifier;
  std::string tensor_globals, modifier_text, tensor_at, tensor_strides;
  if (n.region) {
    for (std::size_t i = 0; i < tensors; ++i) {
      const std::string t = str(static_cast<std::int64_t>(i));
      tensor_globals += "uint t" + t + "_at, t" + t + "_row, t" + t + "_col;  // t" + t + "'s offset and query, key strides\n";
      tensor_at += "    t" + t + "_at += idx * tensor_stride(T" + t + "_DIMS, d);\n";
      tensor_strides += "  t" + t + "_row = tensor_stride(T" + t + "_DIMS, R);\n  t" + t + "_col = tensor_stride(T" + t + "_DIMS, R + 1);\n";
    }
    if (f.sink) {
      const auto slot = static_cast<std::size_t>(std::find(f.arrays.begin(), f.arrays.end(), "SINK") - f.arrays.begin());
      tensor_globals += "uint sink_at, sink_row;  // the sink logits' offset and query stride\n";
      tensor_at += "    sink_at += idx * tensor_stride(SINK_DIMS, d);\n";
      tensor_strides += "  sink_row = tensor_stride(SINK_DIMS, R);\n";
      modifier_text += glsl_template("flash_sink.glsl", {{"LOGIT", widened(f.held_in(slot), "SINK[sink_at + i * sink_row]")}});
    }
    if (tensors > 0 || f.sink) modifier_text += glsl_file("flash_tensor_stride.glsl");
    const std::string fn = with_derivative ? "score_mod_d" : "score_mod";
    const auto outputs = with_derivative ? std::vector<std::string>{"primal", "mod"} : std::vector<std::string>{"mod"};
    modifier_text += "// The score modifier, mod = " + ir::region_expression(*n.region) +
                     (with_derivative ? ", and its derivative d mod / d score: vec2(mod, d mod).\n" : ".\n");
    if (masking.empty()) {
      modifier_text += region_function(*modifier, fn, outputs);
    } else {
      const ir::Graph unmasked = ir::unmasked_region(*n.region);
      const ir::Graph kept = with_derivative ? ir::differentiate_region(unmasked, ir::kRegionScore, true) : unmasked;
      modifier_text += region_function(*modifier, fn + "_masked", outputs);
      modifier_text += "// Without its masks, for tiles they keep whole: mod = " + ir::region_expression(unmasked) + ".\n";
      modifier_text += region_function(kept, fn + "_kept", outputs);
      modifier_text += glsl_template("flash_modifier_switch.glsl", {{"TYPE", with_derivative ? "vec2" : "float"}, {"FN", fn}});
    }
  }
  return {tensor_globals, modifier_text, tensor_at, tensor_strides};
}

/// Dropout on the weights: the factor dropout_mask gives the same element of the weights
/// [batch, N, M] (bits keyed by the seed and its index), with p and 1 / (1 - p) written in; and
/// main()'s setup of it.
std::pair<std::string, std::string> flash_dropout(const Flash& f) {
  const Node& n = f.n;
  const bool drop = f.drop;
  std::string dropout_text, dropout_setup;
  if (drop) {
    const float keep = static_cast<float>(ir::dropout_keep_value(n.attrs.dropout));
    dropout_text = glsl_template("flash_dropout.glsl", {{"P", ir::format_number(n.attrs.dropout)},
                                                        {"PHILOX", philox_function()},
                                                        {"THRESHOLD", str(ir::dropout_threshold(n.attrs.dropout)) + "u"},
                                                        {"KEEP", str(std::bit_cast<std::uint32_t>(keep)) + "u"}});
    dropout_setup = "  batch_index = b;\n  drop_seed = uint(SEED[0]);\n";
  }
  return {dropout_text, dropout_setup};
}

/// tile_masked(qa, qb, ka, kb), where block sparsity is tested (Flash::tests_tiles), with the
/// ranges of the operands it reads (Flash::ranged), or nothing.
std::string flash_tile_test(const Flash& f) {
  const Node& n = f.n;
  const bool mask = f.mask;
  const std::size_t tensors = f.tensors;
  const auto& masking = f.masking;
  const bool region_skips = f.region_skips;
  const bool tests_tiles = f.tests_tiles;
  const std::vector<Ranged>& ranged = f.ranged;
  std::string tile_text;
  if (tests_tiles) {
    const std::string k = str(static_cast<std::int64_t>(ranged.size()));
    tile_text += "\n" + interval_helpers(n.region.get());
    if (region_skips) tile_text += region_bound_function(*n.region, "bound_mod");
    if (!masking.empty()) tile_text += region_bound_function(*n.region, "keeps_mod", &masking);
    if (mask) tile_text += "bool tile_mask_kept = false;  // the keep-mask is nonzero over the tile (set by tile_masked)\n";
    if (!ranged.empty())
      tile_text += glsl_template("flash_tile_ranges.glsl", {{"K", k}, {"KR", str(static_cast<std::int64_t>((3 * ranged.size() + 3) / 4 * 4))}});
    tile_text +=
        "\n// Whether every score of queries [qa, qb] by keys [ka, kb] is masked whatever the scores are\n"
        "// (called by the whole workgroup, which gets one answer).\n"
        "// Sets tile_unmasked (the modifier's masks keep every score) and tile_mask_kept likewise.\n"
        "bool tile_masked(uint qa, uint qb, uint ka, uint kb) {\n";
    if (!masking.empty()) tile_text += "  tile_unmasked = false;\n";
    if (mask) tile_text += "  tile_mask_kept = false;\n";
    if (!ranged.empty()) tile_text += "  uint slot = tile_tests % 3u;\n  ++tile_tests;\n";
    for (std::size_t i = 0; i < ranged.size(); ++i) {
      const Ranged& o = ranged[i];
      tile_text += glsl_template("flash_tile_range.glsl",
                                 {{"A", o.array}, {"ROW", o.row}, {"COL", o.col}, {"AT", o.at}, {"K", k}, {"I", str(static_cast<std::int64_t>(i))}});
    }
    if (!ranged.empty()) tile_text += "  barrier();\n  if (lid == 0u) range_clear((slot + 2u) % 3u);  // last read two tests ago\n";
    for (std::size_t i = 0; i < ranged.size(); ++i) {
      const Ranged& o = ranged[i];
      tile_text += "  Iv r" + str(static_cast<std::int64_t>(i)) + " = range_read(slot * " + k + "u + " + str(static_cast<std::int64_t>(i)) + "u, " +
                   o.row + " != 0u && " + o.col + " != 0u);  // " + o.array + "\n";
    }
    if (mask) {
      const std::string keep = "r" + str(static_cast<std::int64_t>(ranged.size() - 1));
      tile_text += "  if (iv_is(" + keep + ", 0.0)) return true;  // the keep-mask drops every key\n";
      tile_text += "  tile_mask_kept = !" + keep + ".nan && !iv_holds(" + keep + ", 0.0);\n";
    }
    if (region_skips) {
      std::string args = "Iv(float(qa), float(qb), false), Iv(float(ka), float(kb), false)";
      for (std::size_t i = 0; i < tensors; ++i) args += ", r" + str(static_cast<std::int64_t>(i));
      tile_text += "  bool masked = iv_is(bound_mod(" + args + "), neg_inf());\n";
      if (!masking.empty()) tile_text += "  tile_unmasked = !masked && keeps_mod(" + args + ");\n";
      tile_text += "  return masked;\n";
    } else {
      tile_text += "  return false;\n";
    }
    tile_text += "}\n";
  }
  return tile_text;
}

/// The math the kernel calls: the modifier's, the lse's log, and the roundings of its 16-bit
/// outputs (the forward's too, beside a tangent), unless the modifier's helpers define them.
std::string flash_math_helpers(const Flash& f) {
  const Kind kind = f.kind;
  std::string helpers = f.n.region ? math_helpers(*f.modifier, kind == Kind::lse) : kind == Kind::lse ? math_helpers_of({Op::log}) : "";
  std::vector<Op> rounds = Store{f.rounded, f.out_dtype}.rounds();
  if (f.beside.on)
    for (Op round : Store{f.beside.rounded, f.beside.out}.rounds()) rounds.push_back(round);
  for (Op round : rounds)
    if (helpers.find(round == Op::round_f16 ? "float qkv_round_f16(" : "float qkv_round_bf16(") == std::string::npos)
      helpers += math_helpers_of({round});
  return helpers;
}

/// The kernel's declarations and main()'s opening, up to the rows it takes and the streamed rows
/// it visits.
std::string flash_prologue(const Flash& f) {
  const Node& n = f.n;
  const Kind kind = f.kind;
  const bool coop = f.coop;
  const bool causal = f.causal;
  const bool mask = f.mask;
  const bool drop = f.drop;
  const bool key_rows = f.key_rows;
  const bool strided = f.strided;
  const int r = f.r;
  const std::string& own_count = f.own_count;
  const std::string& other_count = f.other_count;
  const std::string& out_width = f.out_width;
  const std::string& out_count = f.out_count;
  const std::size_t tensors = f.tensors;
  const Target* cooperative = f.cooperative;
  const auto [tiles, readers] = flash_tiles_and_readers(f);
  const ModifierText mod = flash_modifier(f);
  const std::pair<std::string, std::string> dropout = flash_dropout(f);
  const bool sixteen =
      is_half(f.out_dtype) || (f.beside.on && is_half(f.beside.out)) || std::any_of(f.held.begin(), f.held.end(), [](DType t) { return is_half(t); });
  std::string tensor_zero;  // t<i>_at accumulates over the batch dims
  for (std::size_t i = 0; i < tensors; ++i) tensor_zero += " t" + str(static_cast<std::int64_t>(i)) + "_at = 0u;";
  if (f.sink) tensor_zero += " sink_at = 0u;";

  const std::string helpers = flash_math_helpers(f);
  // Strided operands' row strides are push constants; the others' are their widths.
  std::string row_strides;
  if (strided) {
    row_strides = "  q_rs = pc.q_row_stride; k_rs = pc.k_row_stride; v_rs = pc.v_row_stride; dy_rs = pc.dy_row_stride; out_rs = pc.out_row_stride;\n";
  } else {
    row_strides = "  q_rs = DR; k_rs = DR; v_rs = DVR; dy_rs = DVR; out_rs = " + out_width + ";\n";
    row_strides += "  dy_at = b * N * DVR;\n";
    row_strides += "  out_at = b * " + out_count + " * out_rs;\n";
  }
  // A paged operand's batch strides are those of its pages' [B, H, page, D] (attention_launch):
  // its offset names the sequence's table row and the head's rows within each page.
  if (f.paging.k) row_strides += "  k_table = k_at / K_PAGE_ELEMS * (M / K_PAGE); k_at %= K_PAGE_ELEMS;\n";
  if (f.paging.v) row_strides += "  v_table = v_at / V_PAGE_ELEMS * (M / V_PAGE); v_at %= V_PAGE_ELEMS;\n";
  std::string s = glsl_template(
      "flash_attention.comp",
      {{"KIND", kind_name(kind) + (causal ? ", causal" : "") + (mask ? ", with a keep-mask" : "") + (n.region ? ", with a score modifier" : "") +
                    (drop ? ", with dropout" : "")},
       {"ROWS", key_rows ? "keys" : "queries"},
       {"OTHERS", key_rows ? "queries" : "keys"},
       {"R", str(r)},
       {"BINDINGS", flash_bindings(f)},
       {"SIXTEEN", sixteen ? "#extension GL_EXT_shader_16bit_storage : require\n" : ""},
       {"PUSH", attention_push_constants(n).glsl()},
       {"TILES", tiles},
       {"READERS", readers + helpers},
       {"SPECS", attention_spec_constants(n, f.paging).glsl()},
       {"COOPEXT", !coop ? ""
                         : std::string("#extension GL_KHR_shader_subgroup_basic : require\n"
                                       "#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require\n") +
                               (coop_lanes(cooperative->subgroup_size, cooperative->cooperative_matrix.m).first > 1
                                    ? "#extension GL_KHR_shader_subgroup_shuffle : require\n"
                                    : "") +
                               (cooperative->cooperative_matrix.emulated
                                    ? ""
                                    : "#extension GL_NV_cooperative_matrix : require\n#extension GL_KHR_memory_scope_semantics : require\n")},
       {"COOPCONSTS", coop ? coop_declarations(*cooperative, true, kind) : ""},
       {"COOPDECL", coop ? coop_declarations(*cooperative, false, kind) : ""},
       {"BR", std::string(f.decode ? "DECODE * RPT + (1u - DECODE) * " : "") + (coop ? "(COOP * NSG * CM + (1u - COOP) * INV * RPT)" : "INV * RPT")},
       {"OWN", f.decode ? "DECODE != 0u ? r0 + t : r0 + t * INV + lid" : "r0 + t * INV + lid"},
       {"BLOCK", f.decode ? "(gl_WorkGroupID.x / pc.parts)" : "gl_WorkGroupID.x"},
       {"SPLITDECL", f.decode ? "shared uint split_last[4];  // decoding: whether this workgroup is its row block's last part\n"
                                "// A partial softmax's weight in a merge whose largest max is mx: 0 where it met no key.\n"
                                "float merge_weight(float m, float mx) { return isinf(m) && m < 0.0 ? 0.0 : exp(m - mx); }\n"
                                "// Where tile row c's vec4 g of a row g4 vec4s wide lies: decoding, the tiles are transposed, so\n"
                                "// that invocations reading their own keys read neighbouring vec4s.\n"
                                "uint tile_at(uint c, uint g, uint g4) { return DECODE != 0u ? g * BC + c : c * g4 + g; }\n"
                              : ""},
       {"TGLOBALS", mod.globals},
       {"MODIFIER", mod.functions},
       {"TENSORAT", mod.at},
       {"TENSORSTRIDES", mod.strides},
       {"TENSORZERO", tensor_zero},
       {"DROPOUT", dropout.first},
       {"TILETEST", flash_tile_test(f)},
       {"DROPSETUP", dropout.second},
       {"KEPT", std::string(causal ? "  int limit = int(i) + shift;\n"
                                     "  keep = int(j) <= limit && (window == 0 || int(j) > limit - window);\n"
                                   : "") +
                    (mask ? "  keep = keep && (tile_mask_kept || KEEP[mask_at + i * pc.mask_row_stride + j * pc.mask_col_stride] != 0.0);\n" : "")},
       {"OWNCOUNT", own_count},
       {"OTHERCOUNT", other_count},
       {"STRIDEDAT", strided ? "    dy_at += idx * pc.dy_batch_strides[d];\n"
                               "    out_at += idx * pc.out_batch_strides[d];\n"
                             : ""},
       {"ROWSTRIDES", row_strides}});
  return s;
}

/// Which streamed rows are visited (causality and a window narrow them, a tile test may skip
/// tiles), made exact where what a skipped row would multiply is not finite.
std::string flash_narrowing(const Flash& f) {
  const Kind kind = f.kind;
  const bool causal = f.causal;
  const bool mask = f.mask;
  const bool key_rows = f.key_rows;
  const std::string& own_count = f.own_count;
  const std::string& other_count = f.other_count;
  const bool region_skips = f.region_skips;
  const bool tests_tiles = f.tests_tiles;
  const std::vector<Ranged>& ranged = f.ranged;
  std::string s;
  // Causality and the window narrow the streamed rows, and tiles the modifier or a keep-mask
  // masks whole may be skipped; skipping is exact only if what their zero probabilities would
  // multiply is finite.
  if (causal)
    s += key_rows ? "  lo = uint(clamp(int(r0) - shift, 0, int(N)));\n"
                    "  if (window > 0) hi = uint(clamp(int(r0 + rows) - 1 - shift + window, 0, int(N)));\n"
                  : "  hi = uint(clamp(int(r0 + rows) + shift, 0, int(M)));\n"
                    "  if (window > 0) lo = uint(clamp(int(r0) + shift - window + 1, 0, int(M)));\n";
  // Split over workgroups (SPLIT), this one's part of the keys, [part_first, part_end): the
  // parts together visit, and check, what one workgroup would.
  const std::string first = f.decode ? "part_first" : "0u", end = f.decode ? "part_end" : other_count;
  if (f.decode)
    s += "  uint part_first = 0u, part_end = M;\n"
         "  if (SPLIT != 0u) {\n"
         "    part_first = min(M, gl_WorkGroupID.x % pc.parts * pc.part_keys);\n"
         "    part_end = min(M, part_first + pc.part_keys);\n"
         "    lo = clamp(lo, part_first, part_end);\n"
         "    hi = clamp(hi, lo, part_end);\n"
         "  }\n";
  // A keep-mask can drop a whole tile only when it does not vary along both axes.
  s += std::string("  bool may_skip = ") +
       (region_skips ? "true"
        : mask       ? "pc.mask_row_stride == 0u || pc.mask_col_stride == 0u"
                     : "false") +
       ";  // tiles tested\n";
  if (causal || tests_tiles) {
    const auto skipped = checked_skipped(kind), own = checked_own(kind);
    if (!skipped.empty() || !own.empty()) {
      // The rows outside [lo, hi), or every row when any tile may be skipped (of the part).
      s += "  if (lid == 0u) nonfinite[0] = 0u;\n  barrier();\n  uint gap = may_skip ? 0u : hi - lo;  // streamed rows surely visited\n";
      for (const Operand& o : skipped)
        s += glsl_template("flash_nonfinite_streamed.glsl", {{"FIRST", first}, {"END", end}, {"W", o.real_width}, {"A", o.array}});
      for (const Operand& o : own)
        s += glsl_template("flash_nonfinite_own.glsl",
                           {{"ANY", causal ? "true" : "may_skip"}, {"OWNCOUNT", own_count}, {"W", o.real_width}, {"A", o.array}});
      s += "  barrier();\n  if (nonfinite[0] != 0u) { lo = " + first + "; hi = " + end + "; may_skip = false; }\n";
    }
  }
  s += "  uint visited = 0u;  // scores in the tiles computed\n";
  if (!ranged.empty()) s += "  if (lid == 0u) { range_clear(0u); range_clear(1u); }\n  barrier();\n";
  return s;
}

/// The row operands in registers (rows past the end hold zeros) and the accumulators.
std::string flash_registers(const Flash& f) {
  const Kind kind = f.kind;
  const std::string& own_count = f.own_count;
  std::string s;
  auto load_rows = [&](const char* reg, const Operand& o) {
    return glsl_template("flash_load_rows.glsl", {{"REG", reg}, {"G", o.vec4s}, {"OWNCOUNT", own_count}, {"A", o.array}});
  };
  auto zeros = [](const char* reg, const char* g) {
    return fill_glsl("  vec4 $REG[RPT * $G];\n  [[unroll]] for (uint x = 0u; x < RPT * $G; ++x) $REG[x] = vec4(0.0);\n", {{"REG", reg}, {"G", g}});
  };
  switch (kind) {
    case Kind::forward:
      s += load_rows("q", kQ) + zeros("o", "DV4") +
           "  float m[RPT], l[RPT];  // per row: the running max, and the sum of exp(s - m)\n"
           "  [[unroll]] for (uint t = 0u; t < RPT; ++t) { m[t] = neg_inf(); l[t] = 0.0; }\n";
      break;
    case Kind::lse:
      s += load_rows("q", kQ) + "  float m[RPT], l[RPT];\n  [[unroll]] for (uint t = 0u; t < RPT; ++t) { m[t] = neg_inf(); l[t] = 0.0; }\n";
      break;
    case Kind::dq:
      s += load_rows("q", kQ) + load_rows("dy", kDy) + zeros("acc", "D4") +
           "  float lse_r[RPT], delta_r[RPT];\n"
           "  [[unroll]] for (uint t = 0u; t < RPT; ++t) {\n"
           "    lse_r[t] = own(t) < N ? LSE[stat_at + own(t)] : 0.0;\n"
           "    delta_r[t] = own(t) < N ? DELTA[stat_at + own(t)] : 0.0;\n  }\n";
      break;
    case Kind::dk: s += load_rows("kr", kK) + load_rows("vr", kV) + zeros("acc", "D4"); break;
    case Kind::dv: s += load_rows("kr", kK) + zeros("acc", "DV4"); break;
    case Kind::jvp:
      s += load_rows("q", kQ) + load_rows("tq", kTq) + zeros("o", "DV4") + zeros("tt", "DV4") +
           "  float m[RPT], l[RPT], mu[RPT];  // per row: the running max, the sum of exp(s - m), and of exp(s - m) s'\n"
           "  [[unroll]] for (uint t = 0u; t < RPT; ++t) { m[t] = neg_inf(); l[t] = 0.0; mu[t] = 0.0; }\n";
      break;
  }
  return s;
}

/// The forward's and the log-sum-exp's pass over a tile: the online softmax, its running max
/// moved once per chunk of four keys, or key by key over packed sequences (f.packed), so that no
/// tile or chunk boundary regroups a sequence's sums.
std::string flash_online_softmax(const Flash& f) {
  const bool forward = f.kind == Kind::forward;
  const std::string score = f.n.region ? "score_mod(sum4(s4[t]) * scale, own(t), t0 + c)" : "sum4(s4[t]) * scale";
  // Decoding, invocation lid takes keys lid, lid + INV, ... of each tile, four at a time.
  const std::string lane = f.decode ? "(DECODE != 0u ? INV : 1u)" : "1u";
  // The sum normalises the undropped weights; v meets the dropped ones.
  const std::string drop = f.packed ? "          if (own(t) < N) p[t] *= dropout_factor(own(t), t0 + c);\n"
                                    : "        if (own(t) < N)\n"
                                      "          [[unroll]] for (uint j = 0u; j < 4u; ++j)\n"
                                      "            if (c0 + j * $CLANE < cols) sc[t][j] *= dropout_factor(own(t), t0 + c0 + j * $CLANE);\n";
  const std::string rescale = "[[unroll]] for (uint g = 0u; g < DV4; ++g) o[t * DV4 + g] *= alpha;\n";
  const std::string scores =
      fill_glsl(glsl_file("flash_chunk_scores.glsl"),
                {{"DOTS", indented(dots("s", "q", "k_tile", "D4", f.decode ? "tile_at(c, g, D4)" : ""), "  ")}, {"SCORE", score}, {"CLANE", lane}});
  return glsl_template(f.packed ? "flash_online_softmax_keys.glsl" : "flash_online_softmax.glsl",
                       {{"SCORES", scores},
                        {"RESCALE", forward ? (f.packed ? "            " : "          ") + rescale : ""},
                        {"DROP", forward && f.drop ? fill_glsl(drop, {{"CLANE", lane}}) : ""},
                        {"ACCUMULATE", forward ? fill_glsl(glsl_file(f.packed ? "flash_pv_key.glsl" : "flash_pv.glsl"),
                                                           {{"CLANE", lane}, {"AT", f.decode ? "tile_at(c, g, DV4)" : "c * DV4 + g"}})
                                               : ""},
                        {"CFIRST", f.decode ? "(DECODE != 0u ? lid : 0u)" : "0u"},
                        {"CSTEP", f.decode ? "(DECODE != 0u ? 4u * INV : 4u)" : "4u"},
                        {"CLANE", lane}});
}

/// The tangent's pass over a tile (flash_jvp_online.glsl): the forward's online softmax with the
/// scores' tangents and three running sums beside it (key by key over packed sequences).
std::string flash_tangent_pass(const Flash& f) {
  const std::string dots_text = dots("s", "q", "k_tile", "D4") + dots("a", "tq", "k_tile", "D4") + dots("b", "q", "tk_tile", "D4");
  const std::string drop =
      f.packed ? "          if (own(t) < N) e[t] *= dropout_factor(own(t), t0 + c);  // after mu: its mean is of the undropped weights\n"
               : "        if (own(t) < N)  // after mu: the weights' mean is of the undropped ones\n"
                 "          [[unroll]] for (uint j = 0u; j < 4u; ++j)\n"
                 "            if (c0 + j < cols) sc[t][j] *= dropout_factor(own(t), t0 + c0 + j);\n";
  const std::string scores = fill_glsl(
      glsl_file("flash_jvp_chunk_scores.glsl"),
      {{"DOTS", indented(dots_text, "  ")},
       {"MODIFIED", f.n.region ? "          vec2 md = score_mod_d(x, own(t), t0 + c);\n          x = md.x;\n          dx *= md.y;\n" : ""}});
  // Where a row's max m_new moves: l, mu, o and tt rescaled to it.
  const std::string move(glsl_file("flash_jvp_max_moves.glsl"));
  return glsl_template(f.packed ? "flash_jvp_online_keys.glsl" : "flash_jvp_online.glsl",
                       {{"SCORES", scores}, {"MOVE", f.packed ? indented(move, "  ") : move}, {"DROP", f.drop ? drop : ""}});
}

/// The tile loop: load the tiles, then each invocation's rows against every tile row c.
std::string flash_tile_loop(const Flash& f) {
  const Node& n = f.n;
  const Kind kind = f.kind;
  const bool drop = f.drop;
  const bool key_rows = f.key_rows;
  const std::string& own_count = f.own_count;
  const bool with_derivative = f.with_derivative;
  std::string s;
  s += "  for (uint t0 = lo; t0 < hi; t0 += BC) {\n"
       "    uint cols = min(BC, hi - t0);\n";
  s += flash_skip(f);
  s += "    visited += rows * cols;\n"
       "    barrier();  // everyone is done with the previous tiles\n";
  for (const Operand& o : streamed(kind))
    s += o.vec4s ? fill_glsl("    for (uint x = lid; x < BC * $G; x += INV) $TILE[$AT] = x / $G < cols ? row4_$A(t0 + x / $G, x % $G) : vec4(0.0);\n",
                             {{"G", o.vec4s},
                              {"TILE", o.tile},
                              {"A", o.array},
                              {"AT", f.decode ? "tile_at(x / " + std::string(o.vec4s) + ", x % " + o.vec4s + ", " + o.vec4s + ")" : "x"}})
                 : fill_glsl("    for (uint x = lid; x < BC; x += INV) $TILE[x] = x < cols ? $A[$AT + t0 + x] : 0.0;\n",
                             {{"TILE", o.tile}, {"A", o.array}, {"AT", o.at}});
  s += "    barrier();\n";
  // p = exp(s - lse), 0 where the score is masked (or -inf), for row t and tile row c.
  const std::string qi = key_rows ? "t0 + c" : "own(t)", kj = key_rows ? "own(t)" : "t0 + c";
  // With a modifier, mod(s) takes the score's place and dq, dk multiply by d mod / d score; both
  // are evaluated wherever the tile is visited, kept or not, as on the cpu.
  const std::string modified = !n.region ? ""
                               : with_derivative
                                   ? "        float dmod = 0.0;\n"
                                     "        if (own(t) < $OWNCOUNT) { vec2 md = score_mod_d(sc, $QI, $KJ); sc = md.x; dmod = md.y; }\n"
                                   : "        if (own(t) < $OWNCOUNT) sc = score_mod(sc, $QI, $KJ);\n";
  const GlslValues at_tile = {{"OWNCOUNT", own_count}, {"QI", qi}, {"KJ", kj}};
  const std::string prob = glsl_template(
      "flash_weight.glsl",
      {{"MODIFIED", fill_glsl(modified, at_tile)}, {"OWNCOUNT", own_count}, {"QI", qi}, {"KJ", kj}, {"LSE", key_rows ? "lse_tile[c]" : "lse_r[t]"}});
  switch (kind) {
    case Kind::forward:
    case Kind::lse: s += flash_online_softmax(f); break;
    case Kind::jvp: s += flash_tangent_pass(f); break;
    case Kind::dq:
    case Kind::dk: {
      // ds = p (dy . v - delta); dq += ds k for query rows, dk += ds q for key rows. With
      // dropout's factor z: ds = p (z dy . v - delta).
      const bool q_rows = kind == Kind::dq;
      s += "    for (uint c = 0u; c < cols; ++c) {\n" + dots("s", q_rows ? "q" : "kr", q_rows ? "k_tile" : "q_tile", "D4") +
           dots("dp", q_rows ? "dy" : "vr", q_rows ? "v_tile" : "dy_tile", "DV4") +
           "      float ds[RPT];\n"
           "      [[unroll]] for (uint t = 0u; t < RPT; ++t) {\n" +
           prob +
           glsl_template("flash_ds_accumulate.glsl", {{"DELTA", q_rows ? "delta_r[t]" : "delta_tile[c]"},
                                                      {"DMOD", n.region ? " * dmod" : ""},
                                                      {"DROP", drop ? " * dropout_factor(" + qi + ", " + kj + ")" : ""},
                                                      {"TILE", q_rows ? "k_tile" : "q_tile"}});
      break;
    }
    case Kind::dv:
      s += "    for (uint c = 0u; c < cols; ++c) {\n" + dots("s", "kr", "q_tile", "D4") +
           "      float p[RPT];\n"
           "      [[unroll]] for (uint t = 0u; t < RPT; ++t) {\n" +
           prob + (drop ? "        p[t] = pr * dropout_factor(" + qi + ", " + kj + ");  // dv = (p z)T dy\n" : "        p[t] = pr;\n") +
           "      }\n"
           "      [[unroll]] for (uint g = 0u; g < DV4; ++g) {\n"
           "        vec4 x = dy_tile[c * DV4 + g];\n"
           "        [[unroll]] for (uint t = 0u; t < RPT; ++t) acc[t * DV4 + g] += p[t] * x;\n"
           "      }\n"
           "    }\n";
      break;
  }
  s += "  }\n\n";
  return s;
}

/// The tile counts, then each row's result in the output's dtype (rounded as Flash::rounded says).
std::string flash_store(const Flash& f) {
  const Kind kind = f.kind;
  std::string s;
  if (f.sink)
    s += glsl_template("flash_sink_fold.glsl",
                       {{"ROWS", "RPT"},
                        {"ROW", "own(t)"},
                        {"O", kind == Kind::forward ? "    [[unroll]] for (uint g = 0u; g < DV4; ++g) o[t * DV4 + g] *= c;\n"
                              : f.tangent ? "    [[unroll]] for (uint g = 0u; g < DV4; ++g) { o[t * DV4 + g] *= c; tt[t * DV4 + g] *= c; }\n"
                                            "    mu[t] *= c;\n"
                                          : ""}});
  const Store output{f.rounded, f.out_dtype};
  auto store = [&](const char* reg, const char* g, const char* width, const char* count, const char* value) {
    return glsl_template("flash_store_rows.glsl",
                         {{"OUT", "OUT"}, {"COUNT", count}, {"G", g}, {"W", width}, {"STORED", output(fill_glsl(value, {{"REG", reg}}))}});
  };
  switch (kind) {
    case Kind::forward:
      s += "  // A row with no key has l = 0 and o = a sum of 0 * v: zeros, or NaN where v holds inf or NaN.\n" +
           store("o", "DV4", "DVR", "N", "l[t] == 0.0 ? $REG[t * DV4 + g][e] : $REG[t * DV4 + g][e] / l[t]");
      break;
    case Kind::lse:
      s += "  [[unroll]] for (uint t = 0u; t < RPT; ++t)  // -inf for a row with no key\n"
           "    if (own(t) < N) OUT[out_at + own(t)] = " +
           output("(m[t] == neg_inf() ? 0.0 : m[t]) + qkv_log(l[t])") + ";\n";
      break;
    case Kind::dq: s += store("acc", "D4", "DR", "N", "$REG[t * D4 + g][e] * scale"); break;
    case Kind::dk: s += store("acc", "D4", "DR", "M", "$REG[t * D4 + g][e] * scale"); break;
    case Kind::dv: s += store("acc", "DV4", "DVR", "M", "$REG[t * DV4 + g][e]"); break;
    case Kind::jvp:
      // y = o / l, y' = tt / l - (mu / l) y: zeros for a row with no key (l = 0), or NaN where v or
      // tv holds inf or NaN, as the cpu's.
      s += "  float inv[RPT];\n  [[unroll]] for (uint t = 0u; t < RPT; ++t) inv[t] = l[t] == 0.0 ? 0.0 : 1.0 / l[t];\n" +
           store("tt", "DV4", "DVR", "N", "$REG[t * DV4 + g][e] * inv[t] - mu[t] * inv[t] * (o[t * DV4 + g][e] * inv[t])");
      if (f.beside.on) {  // the forward's output, divided as the forward's kernel divides it
        const Store forward{f.beside.rounded, f.beside.out};
        s += glsl_template("flash_store_rows.glsl", {{"OUT", "OUTY"},
                                                     {"COUNT", "N"},
                                                     {"G", "DV4"},
                                                     {"W", "DVR"},
                                                     {"STORED", forward("l[t] == 0.0 ? o[t * DV4 + g][e] : o[t * DV4 + g][e] / l[t]")}});
      }
      break;
  }
  // Decoding, the invocations' and parts' softmaxes are merged first, and one invocation stores.
  if (f.decode) return flash_counts() + std::string(glsl_file("flash_decode_merge.glsl")) + "  if (stores) {\n" + indented(s, "  ") + "  }\n";
  return flash_counts() + s;
}

}  // namespace

KernelSource attention_source(const Node& n, const std::vector<DType>& held, DType out_dtype, DType rounded, const Target* cooperative, Paging paging,
                              Beside beside, bool packed) {
  const Flash f(n, held, out_dtype, rounded, cooperative, paging, beside, packed);
  const Kind kind = f.kind;
  const bool coop = f.coop, causal = f.causal, mask = f.mask, drop = f.drop;
  std::string s = flash_prologue(f) + flash_narrowing(f);
  const std::size_t body_at = s.size();  // the scalar path's part of main, from here
  s += flash_registers(f) + flash_tile_loop(f) + flash_store(f);
  const Store output{rounded, out_dtype};
  auto stored = [&](const std::string& value) { return output(value); };
  if (coop) {  // the scalar path, and beside it the cooperative one
    const std::string scalar = s.substr(body_at);
    s.resize(body_at);
    const bool with_drop = drop && kind != Kind::lse;
    s += "  if (COOP != 0u) {\n" +
         indented(coop_grad(kind) ? coop_grad_body(*cooperative, kind, n.region != nullptr, with_drop, flash_skip(f), flash_counts(), stored)
                                  : coop_body(*cooperative, kind, n.region != nullptr, with_drop, f.sink, flash_skip(f), flash_counts(), stored),
                  "  ") +
         "  } else {\n" + indented(scalar, "  ") + "  }\n";
  }
  s += "}\n";
  const Target::CooperativeMatrix* cm = coop ? &cooperative->cooperative_matrix : nullptr;
  std::string name = "flash_attention_" + kind_name(kind) +
                     (cm ? std::string(cm->emulated ? "_coop_emulated" : "_coop") + str(cm->m) + "x" + str(cm->n) + "x" + str(cm->k) : "") +
                     (n.region ? "_flex" : "") + (f.sink ? "_sink" : "") + (causal ? "_causal" : "") + (mask ? "_masked" : "") +
                     (drop ? "_dropout" : "") + (paging.k || paging.v ? "_paged" : "") + (f.beside.on ? "_y" : "") + "_b" + str(f.r) +
                     Store{rounded}.suffix() + (f.beside.on ? Store{f.beside.rounded}.suffix() : "");
  return {name,
          s,
          static_cast<int>(f.arrays.size()) + 2 + (f.decode ? 1 : 0) + (f.beside.on ? 1 : 0),
          true,
          f.decode,
          attention_push_constants(n).signature(),
          attention_spec_constants(n, paging).signature()};
}

namespace {

/// Queries per batch entry up to which the forward may take the decode layout: a decode step's, a
/// few speculated tokens', a grouped-query head's group (as the cpu's kSplitQueries).
constexpr std::int64_t kDecodeQueries = 16;
/// Keys per workgroup when a row block's keys are split (as the cpu's kSplitKeys; more where the
/// parts would pass the dispatch's limit): at head dim 128, 512 keys and values are 512 KiB of
/// f32 to stream, against a merge that reads one row of Dv + 2 floats per part.
constexpr std::int64_t kDecodePartKeys = 512;

/// The tile height for head dims d and dv: at most 32 rows (or the target's override), fewer
/// where shared memory is short. Head dims size the registers and tiles.
std::int64_t tile_height(const Target& target, Kind kind, std::int64_t d, std::int64_t dv) {
  const std::int64_t d4 = std::max<std::int64_t>((d + 3) / 4, 1), dv4 = std::max<std::int64_t>((dv + 3) / 4, 1);
  // Rows live in registers: past D + Dv = 4096 floats a row no device holds them, and drivers
  // take tens of seconds compiling the spills (NVIDIA, D = Dv = 4096). The tangent's rows hold
  // twice that: q and tq, its output's and its tangent's sums.
  if ((kind == Kind::jvp ? 2 : 1) * (d4 + dv4) > 1024)
    throw UnsupportedError("vulkan: attention" + std::string(kind == Kind::jvp ? "'s tangent" : "") + " with head dims " + str(d) + " and " +
                           str(dv) + " exceeds the flash kernels' 4096 floats of registers per row");
  const std::int64_t shared = std::max<std::int64_t>(target.shared_bytes, 16384);
  std::int64_t bc = target.attention_tile ? target.attention_tile : 32;
  // Beside the tiles: the non-finite flag, the tile tests' ranges and the cooperative path's
  // arrays sized for its absence (512 bytes, as coop_shared_bytes reserves).
  while (bc > 1 && bc * tile_row_floats(kind, d4, dv4) * 4 + 512 > shared) bc /= 2;
  if (bc * tile_row_floats(kind, d4, dv4) * 4 + 512 > shared)
    throw UnsupportedError("vulkan: attention with head dims " + str(d) + " and " + str(dv) + " needs more than " + str(shared) +
                           " bytes of shared memory for one row of keys");
  return bc;
}

/// Few queries against many keys (decoding) on a GPU, where most of the query layout's
/// invocations would hold no row: the forward takes its decode layout, the invocations sharing the
/// queries and taking keys of their own, as many as the tile has (at most BC), merged by
/// log-sum-exp; past kDecodePartKeys keys the keys are split over workgroups too, the last part
/// to finish merging them. A function of one batch entry's shape and the device only, never of
/// the batch, so a sequence's bits do not depend on what else is in it. Not on lavapipe, where
/// llvmpipe reads shared memory lane by lane wherever invocations read different addresses and
/// keeps a workgroup's registers in its barriers' coroutine frames: one query against 32,768 /
/// 262,144 keys at head dim 128 took 44 / 290 ms in the decode layout split, 1,183 / 9,682 ms in
/// the query layout split, and 53 / 132 ms unsplit (wall clock, `qkv bench sdpa`).
struct DecodeSplit {
  bool decode = false;
  Geometry geometry{};
  std::int64_t parts = 1, part_keys = 0;
};
DecodeSplit decode_split(const Target& t, Kind kind, std::int64_t nq, std::int64_t mk, Geometry geo, std::int64_t bc, bool packed) {
  DecodeSplit s;
  s.geometry = geo;
  s.part_keys = mk;
  if (kind != Kind::forward || !t.split_kv || t.cpu_device || nq < 1 || nq > kDecodeQueries || nq >= geo.invocations || mk < 1) return s;
  if (packed && t.deterministic) return s;  // the lanes and parts take keys by their packed positions
  s.decode = true;
  s.geometry = {static_cast<std::uint32_t>(std::min<std::int64_t>(geo.invocations, bc)),
                static_cast<std::uint32_t>(std::min<std::int64_t>(nq, geo.rows_per_invocation))};
  const std::int64_t blocks = (nq + s.geometry.rows_per_invocation - 1) / s.geometry.rows_per_invocation;
  if (mk <= kDecodePartKeys) return s;
  s.part_keys = kDecodePartKeys;
  while ((mk + s.part_keys - 1) / s.part_keys * blocks > 65535) s.part_keys *= 2;  // the dispatch's limit
  s.parts = (mk + s.part_keys - 1) / s.part_keys;
  return s;
}

/// Which of `rank` dims (the scores') a tensor of shape `s` broadcasting to them spans: bit d for
/// dim d where s is not 1 there.
std::uint32_t spanned_dims(const Shape& s, int rank) {
  std::uint32_t dims = 0;
  for (int dim = 0; dim < rank; ++dim) {
    const int j = dim - (rank - s.rank);
    if (j >= 0 && s[j] != 1) dims |= 1u << dim;
  }
  return dims;
}

/// Sets node v's operand strides in `push`: each row operand's batch strides as the kernel reads
/// it (a head view's permuted), the mask's broadcast ones (`mask_st`); for strided kernels the row
/// strides and dy's and the output's batch strides (a placed output's through its permute's).
void set_attention_strides(PushConstants::Values& push, const ir::Graph& g, const ir::StoragePlan& storage, ir::ValueId v,
                           const std::vector<Shape>& shapes, const std::array<std::int64_t, ir::kMaxRank>& mask_st) {
  const Node& n = g.node(v);
  const Kind kind = kind_of(n);
  const int r = batch_rank(n);
  const auto ri = static_cast<std::size_t>(r);
  const Shape& out = shapes[static_cast<std::size_t>(v)];
  using Strides = std::array<std::int64_t, ir::kMaxRank>;
  auto read_strides = [&](std::size_t slot) {
    const ir::ValueId x = n.inputs[slot];
    const Shape& s = shapes[static_cast<std::size_t>(x)];
    Strides own = contiguous_strides(s);
    if (const ir::ValueId gather = paged_gather(g, storage, x); gather >= 0) {
      // Paged: the strides of one page's [B, H, page, D] (the table row and the head, which the
      // kernel takes apart: b H + h = at / (page D)).
      Shape page = s;
      page.dims[static_cast<std::size_t>(s.rank - 2)] = shapes[static_cast<std::size_t>(g.node(gather).inputs[0])][2];
      own = contiguous_strides(page);
    }
    if (storage[x].kind == ir::StorageKind::head_view) {
      const Node& p = g.node(x);
      const Strides c = contiguous_strides(shapes[static_cast<std::size_t>(p.inputs[0])]);
      for (int j = 0; j < s.rank; ++j) own[static_cast<std::size_t>(j)] = c[static_cast<std::size_t>(p.attrs.perm[static_cast<std::size_t>(j)])];
    }
    Strides st{};
    for (int j = 0; j < s.rank; ++j)
      if (const int at = r + 2 - s.rank + j; at >= 0) st[static_cast<std::size_t>(at)] = s[j] == 1 ? 0 : own[static_cast<std::size_t>(j)];
    return st;
  };
  const bool grads = kind == Kind::dq || kind == Kind::dk || kind == Kind::dv;
  const Strides none{};
  const Strides q_st = read_strides(0), k_st = read_strides(1), v_st = kind == Kind::lse ? none : read_strides(2),
                dy_st = grads ? read_strides(3) : none;
  // The tangent's kernel reads tq, tk and tv at q's, k's and v's offsets (kTq): the same layout.
  if (kind == Kind::jvp)
    for (std::size_t i = 0; i < 3; ++i)
      QKV_ASSERT(read_strides(3 + i) == read_strides(i), "attention_jvp's tangent " + std::to_string(i) + " is laid out unlike its primal");
  push.set_array("q_batch_strides", std::span(q_st.data(), ri))
      .set_array("k_batch_strides", std::span(k_st.data(), ri))
      .set_array("v_batch_strides", std::span(v_st.data(), ri))
      .set_array("mask_batch_strides", std::span(mask_st.data(), ri));
  if (attention_strided(n)) {
    Strides out_st = contiguous_strides(out);
    if (const ir::ValueId p = storage[v].into.into; p >= 0 && storage[p].kind == ir::StorageKind::placed) {  // the permute's storage
      const Strides c = contiguous_strides(shapes[static_cast<std::size_t>(p)]);
      for (int j = 0; j < out.rank; ++j)
        out_st[static_cast<std::size_t>(g.node(p).attrs.perm[static_cast<std::size_t>(j)])] = c[static_cast<std::size_t>(j)];
    }
    push.set("q_row_stride", push_word(q_st[ri]))
        .set("k_row_stride", push_word(k_st[ri]))
        .set("v_row_stride", push_word(v_st[ri]))
        .set("dy_row_stride", push_word(dy_st[ri]))
        .set("out_row_stride", push_word(out_st[ri]))
        .set_array("dy_batch_strides", std::span(dy_st.data(), ri))
        .set_array("out_batch_strides", std::span(out_st.data(), ri));
  }
}

}  // namespace

ir::ValueId paged_gather(const ir::Graph& g, const ir::StoragePlan& storage, ir::ValueId x) {
  while (storage[x].kind == ir::StorageKind::reshape) x = g.node(x).inputs[0];
  return storage[x].kind == ir::StorageKind::paged ? x : -1;
}

Paging attention_paging(const ir::Graph& g, const ir::StoragePlan& storage, ir::ValueId v) {
  const Node& n = g.node(v);
  const ir::AttentionRoles& roles = ir::attention_roles(n.op);
  auto paged = [&](int slot) { return slot >= 0 && paged_gather(g, storage, n.inputs[static_cast<std::size_t>(slot)]) >= 0; };
  return {paged(roles.k), paged(roles.v)};
}

std::vector<ir::ValueId> attention_operands(const ir::Graph& g, const ir::StoragePlan& storage, ir::ValueId v) {
  std::vector<ir::ValueId> operands = g.node(v).inputs, tables;
  for (ir::ValueId& x : operands)
    if (const ir::ValueId gather = paged_gather(g, storage, x); gather >= 0) {
      x = g.node(gather).inputs[0];
      tables.push_back(g.node(gather).inputs[1]);
    }
  operands.insert(operands.end(), tables.begin(), tables.end());
  return operands;
}

KernelLaunch attention_launch(const ir::Graph& g, const ir::StoragePlan& storage, ir::ValueId v, const std::vector<Shape>& shapes,
                              const Target& target) {
  const Node& n = g.node(v);
  const Kind kind = kind_of(n);
  const int r = batch_rank(n);
  auto in = [&](std::size_t k) -> const Shape& { return shapes[static_cast<std::size_t>(n.inputs[k])]; };
  const Shape& out = shapes[static_cast<std::size_t>(v)];
  const Shape& qs = in(0);
  const Shape& ks = in(1);
  const std::int64_t nq = qs.back(1), mk = ks.back(1), d = qs.back(0);
  const std::int64_t dv = kind == Kind::forward || kind == Kind::jvp ? out.back(0)
                          : kind == Kind::lse                        ? 0
                                                                     : in(static_cast<std::size_t>(ir::attention_roles(n.op).v)).back(0);
  const Shape* mask = nullptr;
  if (masked(n)) mask = &in(static_cast<std::size_t>(ir::attention_roles(n.op).mask));

  KernelLaunch l;
  const std::int64_t shift = n.attrs.causal && n.attrs.align == ir::CausalAlign::bottom_right ? mk - nq : 0;
  const auto mask_st = mask ? broadcast_strides(*mask, r + 2) : std::array<std::int64_t, ir::kMaxRank>{};
  const PushConstants declared = attention_push_constants(n);
  PushConstants::Values push = declared.values();
  const auto ri = static_cast<std::size_t>(r);
  push.set("queries", push_word(nq))
      .set("keys", push_word(mk))
      .set("head_dim", push_word(d))
      .set("value_dim", push_word(dv))
      .set_float("scale", ir::bound_scale(g, n, shapes))
      .set_int("shift", shift)
      .set_int("window", n.attrs.window)
      .set("mask_row_stride", push_word(mask_st[ri]))
      .set("mask_col_stride", push_word(mask_st[ri + 1]));
  std::int64_t batches = 1;
  for (int i = 0; i < r; ++i) batches *= out[i];
  push.set_array("batch", std::span(out.dims.data(), ri));
  set_attention_strides(push, g, storage, v, shapes, mask_st);

  const std::int64_t d4 = std::max<std::int64_t>((d + 3) / 4, 1), dv4 = std::max<std::int64_t>((dv + 3) / 4, 1);
  std::int64_t bc = tile_height(target, kind, d, dv);
  Geometry geo = geometry(target, kind);
  const DecodeSplit split = decode_split(target, kind, nq, mk, geo, bc, packed_sequences(g, n));
  // A kernel with the cooperative path takes it where its tiles fit (coop_launch), its scalar
  // path otherwise; COOP says which (kernels without the path ignore it). Decoding: the scalar.
  const CoopLaunch coop = attention_cooperative(g, storage, v, target) && !split.decode ? coop_launch(target, kind, d4, dv4) : CoopLaunch{};
  if (coop.bc > 0) {
    bc = coop.bc;
    geo = {static_cast<std::uint32_t>(coop.subgroups) * target.subgroup_size, 1};
  }
  if (split.decode) geo = split.geometry;
  if (kind == Kind::forward) push.set("parts", push_word(split.parts)).set("part_keys", push_word(split.part_keys));
  l.push = push.words();
  l.push_signature = declared.signature();
  const SpecConstants spec = attention_spec_constants(n, attention_paging(g, storage, v));
  SpecConstants::Values constants = spec.values();
  constants.set("D4", push_word(d4))
      .set("DV4", push_word(dv4))
      .set("BC", push_word(bc))
      .set("local_size", geo.invocations)
      .set("RPT", geo.rows_per_invocation)
      .set("COOP", coop.bc > 0 ? 1u : 0u);
  if (kind == Kind::forward) constants.set("DECODE", split.decode ? 1u : 0u).set("SPLIT", split.parts > 1 ? 1u : 0u);
  // The modifier's tensors and the sink logits (never along the keys): which of the scores'
  // r + 2 dims each spans.
  for (std::size_t i = 0; i < modifier_tensors(n); ++i)
    constants.set("T" + std::to_string(i) + "_DIMS", spanned_dims(in(ir::fixed_operands(n.op) + i), r + 2));
  if (ir::has_sink(n.op, n.attrs)) constants.set("SINK_DIMS", spanned_dims(in(ir::sink_operand(n.op, n.attrs, n.inputs.size())), r + 2));
  const ir::AttentionRoles& roles = ir::attention_roles(n.op);
  for (const int slot : {roles.k, roles.v})
    if (const ir::ValueId gather = slot < 0 ? -1 : paged_gather(g, storage, n.inputs[static_cast<std::size_t>(slot)]); gather >= 0) {
      const Shape& pages = shapes[static_cast<std::size_t>(g.node(gather).inputs[0])];  // [P, H, page, D]
      const std::string a = slot == roles.k ? "K" : "V";
      constants.set(a + "_PAGE", push_word(pages[2]))
          .set(a + "_POOL", push_word(pages[0]))
          .set(a + "_PAGE_ELEMS", push_word(pages[1] * pages[2] * pages[3]));
    }
  l.specialization = constants.words();
  l.spec_signature = spec.signature();

  const std::int64_t rows = kind == Kind::dk || kind == Kind::dv ? mk : nq;
  const std::int64_t per_group = coop.bc > 0    ? coop.subgroups * target.cooperative_matrix.m
                                 : split.decode ? geo.rows_per_invocation                     // the invocations share the rows
                                                : geo.invocations * geo.rows_per_invocation;  // BR
  const std::int64_t blocks = std::max<std::int64_t>((rows + per_group - 1) / per_group, 1), x = blocks * split.parts;
  const std::int64_t y = std::clamp<std::int64_t>(batches, 1, 65535), z = std::max<std::int64_t>((batches + y - 1) / y, 1);
  if (split.parts > 1) {  // the arrival counts, then each part's rows: m, l and Dv outputs
    l.split_counters = blocks * batches;
    l.split_words = l.split_counters + blocks * batches * split.parts * per_group * (4 * dv4 + 2);
  }
  if (x > 65535 || z > 65535)
    throw UnsupportedError("vulkan: attention over " + str(rows) + " rows and " + str(batches) + " batch entries exceeds the dispatch limits");
  l.groups = {push_word(x), push_word(y), push_word(z)};
  l.scores = batches * nq * mk;
  return l;
}

std::string attention_work_split(const ir::Graph& g, ir::ValueId v, const std::vector<Shape>& shapes, const Target& target) {
  const Node& n = g.node(v);
  if (!ir::is_fused_attention(n.op) || kind_of(n) != Kind::forward) return {};
  const std::int64_t nq = shapes[static_cast<std::size_t>(n.inputs[0])].back(1), mk = shapes[static_cast<std::size_t>(n.inputs[1])].back(1);
  const std::int64_t d = shapes[static_cast<std::size_t>(n.inputs[0])].back(0), dv = shapes[static_cast<std::size_t>(v)].back(0);
  std::int64_t bc = 0;
  try {
    bc = tile_height(target, Kind::forward, d, dv);
  } catch (const UnsupportedError&) {  // head dims the kernel refuses: it says why when it runs
    return {};
  }
  const DecodeSplit split = decode_split(target, Kind::forward, nq, mk, geometry(target, Kind::forward), bc, packed_sequences(g, n));
  std::string s;
  if (split.decode)
    s = "decode layout: " + str(nq) + (nq == 1 ? " query" : " queries") + " against " + str(mk) + " keys, " +
        str(split.geometry.rows_per_invocation) + (split.geometry.rows_per_invocation == 1 ? " query row" : " query rows") +
        " per workgroup shared by its " + str(split.geometry.invocations) + " invocations, each taking keys of its own";
  if (split.parts > 1)
    s += std::string(s.empty() ? "" : "; ") + "split-KV: " + str(nq) + (nq == 1 ? " query" : " queries") + " against " + str(mk) + " keys in " +
         str(split.parts) + " workgroups of " + str(split.part_keys) + " keys per row block, the last to finish merging them by their log-sum-exp";
  return s;
}

}  // namespace qkv::codegen::detail
