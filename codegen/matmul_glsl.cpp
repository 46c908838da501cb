// Matmul, three kernels. On GPUs the tiled kernel, as a GPU engineer writes it: each workgroup
// computes a BM x BN tile of one batch entry's output, each invocation a TM x 4 TN4 block of it in
// registers (vec4s along the columns), and A and B stream through shared memory BK deep in two
// buffers, so the next tile's global loads are in flight while the current one is multiplied,
// with one barrier per tile; the geometry is a set of specialization constants chosen per device
// and shape (matmul_geometry). On CPU devices (lavapipe) the lanes kernel (matmul_lanes_source),
// which has no shared memory and no barrier and shares A's values across a subgroup by broadcasts.
// On devices with cooperative matrices, for f16 operands, the cooperative kernel
// (matmul_cooperative_source). All read their operands in place through their strides
// (transposes are no copies) and broadcast batch dims through per-dim batch strides.
//
// Measured on lavapipe (AMD EPYC Zen 5, 2 threads, LLVM 15, 8 lanes) at 512^3 against OpenBLAS
// sgemm on both cores in the same run (bench/graph_bench.cpp): the old 16 x 16 one-output-per-
// invocation kernel 0.45 GFLOP/s; the tiled kernel 2.6-4.4 (64 x 64 tiles, 8 x 8 per invocation;
// 4 x 4 per invocation 1.4, and every variant within noise of 8 x 8, since lavapipe loads shared
// memory lane by lane and keeps the accumulators of a kernel with barriers in its coroutine frame);
// the lanes kernel 7.2-11.2 (6-9% of sgemm) with 32 rows x 8 columns per lane, which a sweep put
// at 13.2-13.8 beside 16 x 4: 7.2, 32 x 4: 8.5, 16 x 8: 9.6, 64 x 8: 11.6, 32 x 16: 13.2-14.1.
// The kernels' GLSL is in codegen/glsl/matmul_*.comp; this file fills in what depends on the
// operands and the device.
#include "codegen/matmul_glsl.hpp"

#include <algorithm>
#include <span>

#include "codegen/glsl_detail.hpp"
#include "codegen/glsl_files.hpp"
#include "ir/error.hpp"

namespace qkv::codegen {

std::string MatmulGeometry::invalid(std::int64_t shared_limit, std::uint32_t max_invocations) const {
  auto pow2 = [](std::uint32_t v) { return v != 0 && (v & (v - 1)) == 0; };
  if (!pow2(invocations) || invocations > max_invocations) return "invocations must be a power of two up to " + std::to_string(max_invocations);
  if (tm == 0 || tm % 4 != 0 || tm > 16) return "rows per invocation must be 4, 8, 12 or 16";
  if (tn4 == 0 || tn4 > 4) return "vec4 columns per invocation must be 1 to 4";
  if (bk == 0 || bk > 64) return "the tile depth must be 1 to 64";
  if (wn == 0 || invocations % wn != 0) return "invocations across the columns must divide the invocations";
  if (shared_bytes() > shared_limit)
    return "the tiles need " + std::to_string(shared_bytes()) + " bytes of shared memory, more than the device's " + std::to_string(shared_limit);
  return {};
}

namespace detail {

namespace {

using ir::Node;
using ir::Shape;

/// Geometries measured on lavapipe (AMD EPYC Zen 5, 2 threads) and chosen for GPUs; see
/// matmul_geometry.
constexpr MatmulGeometry kCpuTile{64, 8, 2, 16, 8};  // 64 x 64, 8 x 8 per invocation
constexpr MatmulGeometry kCpuThin{32, 4, 1, 8, 32};
constexpr MatmulGeometry kGpuTile{256, 8, 2, 8, 16};  // 128 x 128, 8 x 8 per invocation
constexpr MatmulGeometry kGpuSmall{64, 8, 1, 16, 8};  // 64 x 32
constexpr MatmulGeometry kGpuThin{32, 4, 1, 8, 32};   // 4 x 128: decoding, M = 1

/// The lanes kernel's largest tile (matmul_lanes_source): rows per subgroup in groups of its
/// size, columns per lane, subgroups per workgroup.
constexpr std::uint32_t kLaneRowGroups = 4, kLaneColumns = 8, kLaneSubgroups = 2;

/// The lanes kernel's tile for an M x N output: the largest (4 row groups by 8 columns per lane,
/// best at 512^3, see the top of the file) unless the matrix is smaller, where a tile that fits
/// it computes no padding (a decoder block's projections at 16 x 32: one eighth of the largest
/// tile), and one subgroup per workgroup when one covers the rows.
struct LaneTile {
  std::uint32_t row_groups, columns, subgroups;
};

LaneTile lanes_tile(std::int64_t m, std::int64_t n, std::uint32_t sg) {
  auto fit = [](std::int64_t extent, std::int64_t unit, std::uint32_t most) {
    std::uint32_t t = 1;
    while (t < most && t * unit < extent) t *= 2;
    return t;
  };
  LaneTile t{fit(m, sg, kLaneRowGroups), fit(n, sg, kLaneColumns), 1};
  if (m > static_cast<std::int64_t>(t.row_groups * sg)) t.subgroups = kLaneSubgroups;
  return t;
}

/// Whether matmuls on `target` take the lanes kernel: a CPU device that can broadcast within
/// subgroups of a size the source unrolls, unless a tiled geometry is forced. Its tile is
/// unrolled over 4 x 8 subgroups' rows and columns: past 32 lanes the SPIR-V optimizer's SSA
/// rewriter overflows its stack on it, so wider subgroups take the tiled kernel.
bool uses_lanes(const Target& target) {
  const std::uint32_t sg = target.subgroup_size;
  return target.cpu_device && target.matmul.invocations == 0 && sg >= 4 && sg <= 32 && (sg & (sg - 1)) == 0;
}

/// The operand and output buffers and push constants both matmul kernels declare, with the
/// push-constant layout (matmul_launch's); A and B are read through ld0 and ld1, which widen a
/// 16-bit element exactly, and the output written through st, which rounds to a 16-bit one.
std::string bindings(int batch_rank, const MatmulDtypes& dtypes, const MatmulEpilogue* epilogue) {
  const int extra = epilogue ? epilogue->operands : 0;
  std::string s = "layout(std430, binding = 0) readonly buffer In0 { " + std::string(held_element(dtypes.a)) + " x0[]; };\n" +
                  "layout(std430, binding = 1) readonly buffer In1 { " + held_element(dtypes.b) + " x1[]; };\n";
  for (int k = 0; k < extra; ++k) {
    const DType t = static_cast<std::size_t>(k) < epilogue->held.size() ? epilogue->held[static_cast<std::size_t>(k)] : DType::f32;
    s += "layout(std430, binding = " + std::to_string(2 + k) + ") readonly buffer In" + std::to_string(2 + k) + " { " + held_element(t) + " x" +
         std::to_string(2 + k) + "[]; };\n";
  }
  s += "layout(std430, binding = " + std::to_string(2 + extra) + ") writeonly buffer Out { " + held_element(dtypes.out) + " y[]; };\n";
  s += matmul_push_constants(batch_rank + 2, epilogue ? &epilogue->push : nullptr).glsl();
  s += "float ld0(uint i) { return " + widened(dtypes.a, "x0[i]") + "; }\n";
  s += "float ld1(uint i) { return " + widened(dtypes.b, "x1[i]") + "; }\n";
  if (epilogue) s += "\n// The epilogue: what each store writes.\n" + epilogue->glsl + "\n";
  else s += "float qkv_epilogue(float acc, uint row, uint col) { return acc; }\nvoid qkv_epilogue_batch(uint batch) {}\n";
  // The rounding helper, unless the epilogue's helpers define it.
  auto helper = [&](ir::Op round, const char* name) { return s.find(name) != std::string::npos ? std::string() : math_helpers_of({round}); };
  if (dtypes.out == DType::f16) s += helper(ir::Op::round_f16, "float qkv_round_f16(");
  if (dtypes.out == DType::bf16) s += helper(ir::Op::round_bf16, "float qkv_round_bf16(");
  s += "void st(uint i, float v) { y[i] = " + narrowed(dtypes.out, "v") + "; }\n";
  return s;
}

/// The statement giving staged element `e`'s tile-local (k, row) of A, stepping along k first
/// when `k_first` (A's contiguous index unless transposed), and the same for B's (k, column).
std::string a_tile_index(bool k_first, const char* e) {
  return k_first ? std::string("uint kk = ") + e + " % BK, r = " + e + " / BK;" : std::string("uint r = ") + e + " % BM, kk = " + e + " / BM;";
}
std::string b_tile_index(bool n_first, const char* e) {
  return n_first ? std::string("uint c = ") + e + " % BN, kk = " + e + " / BN;" : std::string("uint kk = ") + e + " % BK, c = " + e + " / BK;";
}

/// The extension a kernel with 16-bit buffers (its epilogue's operands too) needs, or nothing.
std::string sixteen_bit(const MatmulDtypes& d, const MatmulEpilogue* epilogue) {
  const bool operands = epilogue && std::any_of(epilogue->held.begin(), epilogue->held.end(), [](DType t) { return is_half(t); });
  return is_half(d.a) || is_half(d.b) || is_half(d.out) || operands ? "#extension GL_EXT_shader_16bit_storage : require\n" : "";
}

/// The kernel name's suffix for 16-bit buffers: "_f16a" and the like.
std::string dtype_suffix(const MatmulDtypes& d) {
  std::string s;
  if (is_half(d.a)) s += "_" + std::string(dtype_name(d.a)) + "a";
  if (is_half(d.b)) s += "_" + std::string(dtype_name(d.b)) + "b";
  if (is_half(d.out)) s += "_" + std::string(dtype_name(d.out)) + "y";
  return s;
}

/// k named for its epilogue, binding its buffers, declaring its push constants after the matmul's
/// of an output of `rank` dims, and the specialization constants of its kernel.
KernelSource named(KernelSource k, int rank, const MatmulEpilogue* epilogue, MatmulKernel kernel) {
  k.push_signature = matmul_push_constants(rank, epilogue ? &epilogue->push : nullptr).signature();
  k.spec_signature = matmul_spec_constants(kernel).signature();
  if (epilogue) {
    k.name += epilogue->name;
    k.buffers += epilogue->operands;
  }
  return k;
}

/// Statements adding the batch entry `rem`'s offsets to oa and ob through the broadcast batch
/// strides.
std::string batch_offsets(int batch_rank) {
  std::string s;
  for (int d = batch_rank - 1; d >= 0; --d) {
    const std::string at = "[" + std::to_string(d) + "]";
    s += "  { uint idx = rem % pc.batch" + at + "; rem /= pc.batch" + at + "; oa += idx * pc.a_batch_strides" + at +
         "; ob += idx * pc.b_batch_strides" + at + "; }\n";
  }
  return s;
}

}  // namespace

MatmulGeometry matmul_geometry(const Target& target, std::int64_t m, std::int64_t n) {
  if (target.matmul.invocations) return target.matmul;
  if (m <= 4) return target.cpu_device ? kCpuThin : kGpuThin;
  if (target.cpu_device) return kCpuTile;
  // Every device offers 16 KiB of shared memory and 128 invocations; the big tile needs 256.
  const bool big = m >= 128 && n >= 128 && kGpuTile.invalid(target.shared_bytes, target.max_invocations).empty();
  return big ? kGpuTile : kGpuSmall;
}

PushConstants matmul_push_constants(int rank, const PushConstants* epilogue) {
  using T = PushConstants::Type;
  PushConstants p;
  p.scalar("M", T::u32, "the output's rows")
      .scalar("N", T::u32, "its columns")
      .scalar("K", T::u32, "the depth")
      .scalar("a_row_stride", T::u32, "A's stride between rows (elements)")
      .scalar("a_depth_stride", T::u32, "A's along the depth")
      .scalar("b_depth_stride", T::u32, "B's along the depth")
      .scalar("b_col_stride", T::u32, "B's between columns");
  if (rank > 2)
    p.array("batch", rank - 2, "the output's batch dims")
        .array("a_batch_strides", rank - 2, "A's strides over them (0 where it broadcasts)")
        .array("b_batch_strides", rank - 2, "B's");
  if (epilogue) p.extend(*epilogue);
  return p;
}

int matmul_push_words(int rank) { return matmul_push_constants(rank).words(); }

SpecConstants matmul_spec_constants(MatmulKernel kernel) {
  SpecConstants c;
  switch (kernel) {
    case MatmulKernel::tiled:
      c.local_size("NT invocations")
          .constant("TM", 8, "output rows per invocation (a multiple of 4)")
          .constant("TN4", 1, "output columns per invocation, in vec4s")
          .constant("BK", 16, "the depth of a shared tile")
          .constant("WN", 8, "invocations across a tile's columns")
          .constant("NT", 64, "invocations (the local size)");
      break;
    case MatmulKernel::lanes:
      c.local_size("whole subgroups")
          .constant("RG", kLaneRowGroups, "row groups of a subgroup's size per subgroup")
          .constant("TN", kLaneColumns, "columns per lane");
      break;
    case MatmulKernel::cooperative: c.local_size("NT invocations: SM x SN subgroups"); break;
  }
  return c;
}

namespace {

KernelSource matmul_tiled_source(const Node& n, const MatmulDtypes& dtypes, const MatmulEpilogue* epilogue) {
  const int batch_rank = n.shape.rank - 2;
  const std::string br = std::to_string(batch_rank);
  // Which index of a tile the invocations step through first when loading it: the operand's
  // contiguous one (k for A and n for B unless transposed).
  const bool a_k_first = !n.attrs.transpose_a, b_n_first = !n.attrs.transpose_b;
  const std::string s = glsl_template("matmul_tiled.comp", {{"SIXTEEN_BIT", sixteen_bit(dtypes, epilogue)},
                                                            {"SPEC_CONSTANTS", matmul_spec_constants(MatmulKernel::tiled).glsl()},
                                                            {"BINDINGS", bindings(batch_rank, dtypes, epilogue)},
                                                            {"A_TILE_INDEX", a_tile_index(a_k_first, "e")},
                                                            {"B_TILE_INDEX", b_tile_index(b_n_first, "e")},
                                                            {"BATCH_OFFSETS", batch_offsets(batch_rank)}});
  std::string name = "matmul_b" + br + (n.attrs.transpose_a ? "_ta" : "") + (n.attrs.transpose_b ? "_tb" : "") + dtype_suffix(dtypes);
  return named({name, s, 3}, n.shape.rank, epilogue, MatmulKernel::tiled);
}

std::string str(std::uint32_t v) { return std::to_string(v); }

/// The lanes kernel's unrolled parts (matmul_lanes.comp), for subgroups of `sg`. Lane `lane`'s
/// rows of A (ra<i>: whether it is in the matrix, ka<i>, and where, pa<i>) and columns of B
/// (cb<j>, kb<j>, pb<j>).
std::string lanes_operands(std::uint32_t sg) {
  std::string s;
  for (std::uint32_t i = 0; i < kLaneRowGroups; ++i)
    s += "  uint ra" + str(i) + " = r0 + " + str(i * sg) + "u + lane; bool ka" + str(i) + " = " + str(i) + "u < RG && ra" + str(i) + " < M; uint pa" +
         str(i) + " = oa + min(ra" + str(i) + ", M - 1u) * pc.a_row_stride;\n";
  for (std::uint32_t j = 0; j < kLaneColumns; ++j)
    s += "  uint cb" + str(j) + " = c0 + " + str(j * sg) + "u + lane; bool kb" + str(j) + " = " + str(j) + "u < TN && cb" + str(j) + " < N; uint pb" +
         str(j) + " = ob + min(cb" + str(j) + ", N - 1u) * pc.b_col_stride;\n";
  return s;
}

/// The accumulators c<row>_<column>, zero.
std::string lanes_accumulators(std::uint32_t sg) {
  std::string s;
  for (std::uint32_t r = 0; r < kLaneRowGroups * sg; ++r) {
    s += "  float";
    for (std::uint32_t j = 0; j < kLaneColumns; ++j) s += std::string(j ? "," : "") + " c" + str(r) + "_" + str(j) + " = 0.0";
    s += ";\n";
  }
  return s;
}

/// Per step k of the depth: the lane's values of A (a<i>) and B (b<j>), 0 outside the matrices.
std::string lanes_loads() {
  std::string s;
  for (std::uint32_t i = 0; i < kLaneRowGroups; ++i)
    s += "    float a" + str(i) + " = 0.0; if (" + str(i) + "u < RG) { a" + str(i) + " = ld0(pa" + str(i) + " + k * pc.a_depth_stride); a" + str(i) +
         " = ka" + str(i) + " ? a" + str(i) + " : 0.0; }\n";
  for (std::uint32_t j = 0; j < kLaneColumns; ++j)
    s += "    float b" + str(j) + " = 0.0; if (" + str(j) + "u < TN) { b" + str(j) + " = ld1(pb" + str(j) + " + k * pc.b_depth_stride); b" + str(j) +
         " = kb" + str(j) + " ? b" + str(j) + " : 0.0; }\n";
  return s;
}

/// Each row's value of A broadcast from the lane that loaded it, times the lane's values of B.
std::string lanes_products(std::uint32_t sg) {
  std::string s;
  for (std::uint32_t r = 0; r < kLaneRowGroups * sg; ++r) {
    s += "    if (" + str(r / sg) + "u < RG) { float a = subgroupBroadcast(a" + str(r / sg) + ", " + str(r % sg) + "u);";
    for (std::uint32_t j = 0; j < kLaneColumns; ++j)
      s += (j ? " if (" + str(j) + "u < TN)" : std::string()) + " c" + str(r) + "_" + str(j) + " = fma(a, b" + str(j) + ", c" + str(r) + "_" +
           str(j) + ");";
    s += " }\n";
  }
  return s;
}

/// The stores of the accumulators in the matrix, through the epilogue.
std::string lanes_stores(std::uint32_t sg, bool epilogue) {
  const std::uint32_t rows = kLaneRowGroups * sg, cols = kLaneColumns;
  std::string s;
  // An epilogue is inlined where it is called: unrolled over a tile of more than 256 stores (at
  // subgroups of 16, 512 copies of a GELU's gradient) it overflowed the stack of the SPIR-V
  // optimizer's SSA rewriter, so such a tile calls it once, in a loop (which lavapipe compiles
  // slower: smaller tiles keep the unrolled stores).
  if (!epilogue || rows * cols <= 256) {
    for (std::uint32_t r = 0; r < rows; ++r) {
      s += "  if (" + str(r / sg) + "u < RG && r0 + " + str(r) + "u < M) {";
      for (std::uint32_t j = 0; j < cols; ++j)
        s += " if (kb" + str(j) + ") st(oy + (r0 + " + str(r) + "u) * N + cb" + str(j) + ", qkv_epilogue(c" + str(r) + "_" + str(j) + ", r0 + " +
             str(r) + "u, cb" + str(j) + "));";
      s += " }\n";
    }
  } else {
    std::string acc, bases, kept;
    for (std::uint32_t r = 0; r < rows; ++r)
      for (std::uint32_t j = 0; j < cols; ++j) acc += std::string(r + j ? ", " : "") + "c" + str(r) + "_" + str(j);
    for (std::uint32_t j = 0; j < cols; ++j) {
      bases += std::string(j ? ", " : "") + "cb" + str(j);
      kept += std::string(j ? ", " : "") + "kb" + str(j);
    }
    s += glsl_template("matmul_lanes_store_loop.glsl", {{"COUNT", str(rows * cols)},
                                                        {"ACCUMULATORS", acc},
                                                        {"COLS", str(cols)},
                                                        {"COLUMNS", bases},
                                                        {"KEPT", kept},
                                                        {"ROWS", str(rows)},
                                                        {"SG", str(sg)}});
  }
  return s;
}

/// The matmul for CPU devices (lavapipe), where a subgroup is one SIMD register of lanes: every
/// per-lane load from memory, shared or global, is a loop over the lanes (gathers), while a
/// broadcast within the subgroup is one register shuffle, and a barrier turns the shader into a
/// coroutine whose live values (the accumulators) move to memory. So this kernel has no shared
/// memory and no barrier: a subgroup computes R rows by SG x TN columns, each lane TN columns
/// (c0 + j SG + lane) of all R rows in registers. Per step of the depth a lane loads R / SG
/// values of A (rows r0 + i SG + lane) and TN of B, and the rows' values reach every lane by
/// subgroupBroadcast: R / SG + TN gathers for R TN multiply-adds, against 2 (TM + 4 TN4) for
/// the tiled kernel's reads from shared memory. R, TN and SG are written into the source
/// (unrolled, so that the accumulators stay registers); the subgroups per workgroup are a
/// specialization constant.
KernelSource matmul_lanes_source(const Node& n, std::uint32_t sg, const MatmulDtypes& dtypes, const MatmulEpilogue* epilogue) {
  const int batch_rank = n.shape.rank - 2;
  const std::string s = glsl_template("matmul_lanes.comp", {{"SIXTEEN_BIT", sixteen_bit(dtypes, epilogue)},
                                                            {"SG", std::to_string(sg)},
                                                            {"SPEC_CONSTANTS", matmul_spec_constants(MatmulKernel::lanes).glsl()},
                                                            {"BINDINGS", bindings(batch_rank, dtypes, epilogue)},
                                                            {"BATCH_OFFSETS", batch_offsets(batch_rank)},
                                                            {"OPERANDS", lanes_operands(sg)},
                                                            {"ACCUMULATORS", lanes_accumulators(sg)},
                                                            {"LOADS", lanes_loads()},
                                                            {"PRODUCTS", lanes_products(sg)},
                                                            {"STORES", lanes_stores(sg, epilogue != nullptr)}});
  std::string name = "matmul_lanes" + str(sg) + "_b" + std::to_string(batch_rank) + (n.attrs.transpose_a ? "_ta" : "") +
                     (n.attrs.transpose_b ? "_tb" : "") + dtype_suffix(dtypes);
  return named({name, s, 3}, n.shape.rank, epilogue, MatmulKernel::lanes);
}

/// Fragments per subgroup (rows x columns) and subgroups per workgroup (rows x columns) of the
/// cooperative-matrix kernel: a workgroup of four subgroups computes 2 x 2 fragments each.
constexpr std::uint32_t kCoopFragments = 2, kCoopSubgroups = 2;

/// The matmul with cooperative matrices (GL_NV_cooperative_matrix), as tensor-core kernels are
/// written: a workgroup of SM x SN subgroups computes a BM x BN tile of one batch entry's output,
/// each subgroup FM x FN fragments of CM x CN (the device's fragment shape) accumulated in f32.
/// Per step of BK along the depth, the workgroup stages A's BM x BK and B's BK x BN tiles in
/// shared memory as f16 (exact: the operands are f16 values), zero past the matrices' edges,
/// read through the operands' strides (transposes and broadcast batches as the other kernels);
/// each subgroup loads its fragments from there (coopMatLoadNV) and multiplies them into its
/// accumulators (coopMatMulAddNV). At the end the accumulators go to shared memory
/// (coopMatStoreNV) and every invocation stores output elements through the epilogue, rows
/// contiguous. Shared rows are padded by 8 halves (4 floats): offsets and strides stay multiples
/// of 16 bytes, as the loads require, and rows fall on different banks.
///
/// `emulated` replaces the three fragment operations (zero, multiply-add, store) by scalar code
/// over the same shared tiles, each invocation owning CM CN / SG elements of each fragment: the
/// staging, indexing and epilogue, everything but the fragment instructions, then run and are
/// tested on devices without cooperative matrices.
KernelSource matmul_cooperative_source(const Node& n, const Target& target, const MatmulDtypes& dtypes, const MatmulEpilogue* epilogue) {
  const Target::CooperativeMatrix& cm = target.cooperative_matrix;
  const int batch_rank = n.shape.rank - 2;
  const bool emulated = cm.emulated;
  const auto literal = [](std::uint32_t v) { return std::to_string(v) + "u"; };
  const bool a_k_first = !n.attrs.transpose_a, b_n_first = !n.attrs.transpose_b;
  const std::string s =
      glsl_template("matmul_coop.comp",
                    {{"SIXTEEN_BIT", sixteen_bit(dtypes, epilogue)},
                     {"COOPERATIVE_EXTENSIONS",
                      emulated ? "" : "#extension GL_NV_cooperative_matrix : require\n#extension GL_KHR_memory_scope_semantics : require\n"},
                     {"SPEC_CONSTANTS", matmul_spec_constants(MatmulKernel::cooperative).glsl()},
                     {"CM", literal(cm.m)},
                     {"CN", literal(cm.n)},
                     {"CK", literal(cm.k)},
                     {"FRAGMENTS", literal(kCoopFragments)},
                     {"SUBGROUPS", literal(kCoopSubgroups)},
                     {"SG", literal(target.subgroup_size)},
                     {"BINDINGS", bindings(batch_rank, dtypes, epilogue)},
                     {"FRAGMENT_OPERATIONS", std::string(glsl_file(emulated ? "matmul_coop_fragments_emulated.glsl" : "matmul_coop_fragments.glsl"))},
                     {"A_TILE_INDEX", a_tile_index(a_k_first, "e")},
                     {"B_TILE_INDEX", b_tile_index(b_n_first, "e")},
                     {"BATCH_OFFSETS", batch_offsets(batch_rank)}});
  std::string name = std::string(emulated ? "matmul_coop_emulated" : "matmul_coop") + std::to_string(cm.m) + "x" + std::to_string(cm.n) + "x" +
                     std::to_string(cm.k) + "_b" + std::to_string(batch_rank) + (n.attrs.transpose_a ? "_ta" : "") +
                     (n.attrs.transpose_b ? "_tb" : "") + dtype_suffix(dtypes);
  return named({name, s, 3}, n.shape.rank, epilogue, MatmulKernel::cooperative);
}

}  // namespace

bool uses_cooperative_matrix(const Target& target, const MatmulDtypes& dtypes) {
  const Target::CooperativeMatrix& cm = target.cooperative_matrix;
  const std::uint32_t sg = target.subgroup_size;
  if (cm.m == 0 || !dtypes.f16_values || sg == 0 || cm.m * cm.n % sg != 0 || 2 * cm.m * cm.k % sg != 0) return false;
  // The kernel's tiles (matmul_cooperative_source) within the device's limits.
  const std::int64_t bm = kCoopSubgroups * kCoopFragments * cm.m, bn = kCoopSubgroups * kCoopFragments * cm.n, bk = 2 * cm.k;
  const std::int64_t shared = bm * (bk + 8) * 2 + bk * (bn + 8) * 2 + bm * (bn + 4) * 4;
  return shared <= target.shared_bytes && kCoopSubgroups * kCoopSubgroups * sg <= target.max_invocations;
}

std::string matmul_family(const Target& target, const MatmulDtypes& dtypes) {
  if (uses_cooperative_matrix(target, dtypes)) {
    const auto& cm = target.cooperative_matrix;
    return std::string(cm.emulated ? "matmul_coop_emulated" : "matmul_coop") + std::to_string(cm.m) + "x" + std::to_string(cm.n) + "x" +
           std::to_string(cm.k);
  }
  return uses_lanes(target) ? "matmul_lanes" + std::to_string(target.subgroup_size) : "matmul";
}

KernelSource matmul_source(const Node& n, const Target& target, const MatmulDtypes& dtypes, const MatmulEpilogue* epilogue) {
  if (uses_cooperative_matrix(target, dtypes)) return matmul_cooperative_source(n, target, dtypes, epilogue);
  return uses_lanes(target) ? matmul_lanes_source(n, target.subgroup_size, dtypes, epilogue) : matmul_tiled_source(n, dtypes, epilogue);
}

KernelLaunch matmul_launch(const Node& n, const std::vector<Shape>& shapes, const Shape& os, const Target& target, const MatmulDtypes& dtypes,
                           const PushConstants* epilogue, const std::function<void(PushConstants::Values&)>& set_epilogue) {
  const Shape& as = shapes[static_cast<std::size_t>(n.inputs[0])];
  const Shape& bs = shapes[static_cast<std::size_t>(n.inputs[1])];
  const bool ta = n.attrs.transpose_a, tb = n.attrs.transpose_b;
  const std::int64_t m = os.back(1), nn = os.back(0), k = ta ? as.back(1) : as.back(0);
  KernelLaunch l;
  const PushConstants declared = matmul_push_constants(os.rank, epilogue);
  PushConstants::Values push = declared.values();
  push.set("M", push_word(m))
      .set("N", push_word(nn))
      .set("K", push_word(k))
      .set("a_row_stride", push_word(ta ? 1 : k))
      .set("a_depth_stride", push_word(ta ? m : 1))
      .set("b_depth_stride", push_word(tb ? 1 : nn))
      .set("b_col_stride", push_word(tb ? k : 1));
  Shape batch, ab, bb;
  for (int i = 0; i + 2 < os.rank; ++i) batch.push_back(os[i]);
  for (int i = 0; i + 2 < as.rank; ++i) ab.push_back(as[i]);
  for (int i = 0; i + 2 < bs.rank; ++i) bb.push_back(bs[i]);
  auto sa = broadcast_strides(ab, batch.rank), sb = broadcast_strides(bb, batch.rank);
  if (batch.rank > 0) {
    std::array<std::int64_t, ir::kMaxRank> a_strides{}, b_strides{};
    for (std::size_t i = 0; i < static_cast<std::size_t>(batch.rank); ++i) {
      a_strides[i] = sa[i] * m * k;
      b_strides[i] = sb[i] * k * nn;
    }
    const auto r = static_cast<std::size_t>(batch.rank);
    push.set_array("batch", std::span(batch.dims.data(), r))
        .set_array("a_batch_strides", std::span(a_strides.data(), r))
        .set_array("b_batch_strides", std::span(b_strides.data(), r));
  }
  if (set_epilogue) set_epilogue(push);
  l.push = push.words();
  l.push_signature = declared.signature();
  // The kernel's specialization constants, set by name.
  auto specialized = [&](MatmulKernel kernel, const std::function<void(SpecConstants::Values&)>& set) {
    const SpecConstants spec = matmul_spec_constants(kernel);
    SpecConstants::Values constants = spec.values();
    set(constants);
    l.specialization = constants.words();
    l.spec_signature = spec.signature();
  };
  if (uses_cooperative_matrix(target, dtypes)) {
    const Target::CooperativeMatrix& cm = target.cooperative_matrix;
    const std::int64_t bm = kCoopSubgroups * kCoopFragments * cm.m, bn = kCoopSubgroups * kCoopFragments * cm.n;
    l.groups = {push_word(std::max<std::int64_t>(1, (nn + bn - 1) / bn)), push_word(std::max<std::int64_t>(1, (m + bm - 1) / bm)),
                push_word(batch.numel())};
    specialized(MatmulKernel::cooperative,
                [&](SpecConstants::Values& c) { c.set("local_size", kCoopSubgroups * kCoopSubgroups * target.subgroup_size); });
    return l;
  }
  if (uses_lanes(target)) {
    const std::uint32_t sg = target.subgroup_size;
    const LaneTile t = lanes_tile(m, nn, sg);
    const std::int64_t rows = t.row_groups * t.subgroups * sg, cols = t.columns * sg;
    l.groups = {push_word(std::max<std::int64_t>(1, (nn + cols - 1) / cols)), push_word(std::max<std::int64_t>(1, (m + rows - 1) / rows)),
                push_word(batch.numel())};
    specialized(MatmulKernel::lanes,
                [&](SpecConstants::Values& c) { c.set("local_size", t.subgroups * sg).set("RG", t.row_groups).set("TN", t.columns); });
    return l;
  }
  const MatmulGeometry g = matmul_geometry(target, m, nn);
  l.groups = {push_word(std::max<std::int64_t>(1, (nn + g.bn() - 1) / g.bn())), push_word(std::max<std::int64_t>(1, (m + g.bm() - 1) / g.bm())),
              push_word(batch.numel())};
  specialized(MatmulKernel::tiled, [&](SpecConstants::Values& c) {
    c.set("local_size", g.invocations).set("TM", g.tm).set("TN4", g.tn4).set("BK", g.bk).set("WN", g.wn).set("NT", g.invocations);
  });
  return l;
}

}  // namespace detail
}  // namespace qkv::codegen
