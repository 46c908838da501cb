// Matmul, two kernels. On GPUs the tiled kernel, as a GPU engineer writes it: each workgroup
// computes a BM x BN tile of one batch entry's output, each invocation a TM x 4 TN4 block of it in
// registers (vec4s along the columns), and A and B stream through shared memory BK deep in two
// buffers, so the next tile's global loads are in flight while the current one is multiplied,
// with one barrier per tile; the geometry is a set of specialization constants chosen per device
// and shape (matmul_geometry). On CPU devices (lavapipe) the lanes kernel (matmul_lanes_source),
// which has no shared memory and no barrier and shares A's values across a subgroup by broadcasts.
// Both read their operands in place through their strides (transposes are no copies) and
// broadcast batch dims through per-dim batch strides.
//
// Measured on lavapipe (AMD EPYC Zen 5, 2 threads, LLVM 15, 8 lanes) at 512^3 against OpenBLAS
// sgemm on both cores in the same run (bench/graph_bench.cpp): the old 16 x 16 one-output-per-
// invocation kernel 0.45 GFLOP/s; the tiled kernel 2.6-4.4 (64 x 64 tiles, 8 x 8 per invocation;
// 4 x 4 per invocation 1.4, and every variant within noise of 8 x 8, since lavapipe loads shared
// memory lane by lane and keeps the accumulators of a kernel with barriers in its coroutine frame);
// the lanes kernel 7.2-11.2 (6-9% of sgemm) with 32 rows x 8 columns per lane, which a sweep put
// at 13.2-13.8 beside 16 x 4: 7.2, 32 x 4: 8.5, 16 x 8: 9.6, 64 x 8: 11.6, 32 x 16: 13.2-14.1.
#include "codegen/matmul_glsl.hpp"

#include <algorithm>

#include "codegen/glsl_detail.hpp"
#include "ir/error.hpp"

namespace qkv::codegen {

std::string MatmulGeometry::invalid(std::int64_t shared_limit, std::uint32_t max_invocations) const {
  auto pow2 = [](std::uint32_t v) { return v != 0 && (v & (v - 1)) == 0; };
  if (!pow2(invocations) || invocations > max_invocations)
    return "invocations must be a power of two up to " + std::to_string(max_invocations);
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
constexpr MatmulGeometry kCpuTile{64, 8, 2, 16, 8};    // 64 x 64, 8 x 8 per invocation
constexpr MatmulGeometry kCpuThin{32, 4, 1, 8, 32};
constexpr MatmulGeometry kGpuTile{256, 8, 2, 8, 16};   // 128 x 128, 8 x 8 per invocation
constexpr MatmulGeometry kGpuSmall{64, 8, 1, 16, 8};   // 64 x 32
constexpr MatmulGeometry kGpuThin{32, 4, 1, 8, 32};    // 4 x 128: decoding, M = 1

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
/// subgroups of a size the source unrolls, unless a tiled geometry is forced.
bool uses_lanes(const Target& target) {
  const std::uint32_t sg = target.subgroup_size;
  return target.cpu && target.matmul.invocations == 0 && sg >= 4 && sg <= 64 && (sg & (sg - 1)) == 0;
}

/// The operand and output buffers and push constants both matmul kernels declare, with the
/// push-constant layout (matmul_launch's).
std::string bindings(int batch_rank, const MatmulEpilogue* epilogue) {
  const int extra = epilogue ? epilogue->operands : 0;
  std::string s = "layout(std430, binding = 0) readonly buffer In0 { float x0[]; };\n"
                  "layout(std430, binding = 1) readonly buffer In1 { float x1[]; };\n";
  for (int k = 0; k < extra; ++k)
    s += "layout(std430, binding = " + std::to_string(2 + k) + ") readonly buffer In" + std::to_string(2 + k) + " { float x" + std::to_string(2 + k) + "[]; };\n";
  s += "layout(std430, binding = " + std::to_string(2 + extra) + ") writeonly buffer Out { float y[]; };\n"
       "layout(push_constant) uniform Params { uint p[" + std::to_string(kMaxPushWords) + "]; } pc;\n"
       "// p[0..2] = M, N, K; p[3..6] = a's row and column strides, b's row and column strides;\n"
       "// then " + std::to_string(batch_rank) + " batch dims, a's and b's batch strides (elements)\n";
  if (epilogue) s += "\n// The epilogue: what each store writes.\n" + epilogue->glsl + "\n";
  else s += "float qkv_epilogue(float acc, uint row, uint col) { return acc; }\nvoid qkv_epilogue_batch(uint batch) {}\n";
  return s;
}

KernelSource named(KernelSource k, const MatmulEpilogue* epilogue) {
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
    std::string dim = std::to_string(7 + d), sa = std::to_string(7 + batch_rank + d), sb = std::to_string(7 + 2 * batch_rank + d);
    s += "  { uint idx = rem % pc.p[" + dim + "]; rem /= pc.p[" + dim + "]; oa += idx * pc.p[" + sa + "]; ob += idx * pc.p[" + sb + "]; }\n";
  }
  return s;
}

}  // namespace

MatmulGeometry matmul_geometry(const Target& target, std::int64_t m, std::int64_t n) {
  if (target.matmul.invocations) return target.matmul;
  if (m <= 4) return target.cpu ? kCpuThin : kGpuThin;
  if (target.cpu) return kCpuTile;
  // Every device offers 16 KiB of shared memory and 128 invocations; the big tile needs 256.
  const bool big = m >= 128 && n >= 128 && kGpuTile.invalid(target.shared_bytes, target.max_invocations).empty();
  return big ? kGpuTile : kGpuSmall;
}

int matmul_push_words(int rank) { return 7 + 3 * (rank - 2); }

namespace {

KernelSource matmul_tiled_source(const Node& n, const MatmulEpilogue* epilogue) {
  const int batch_rank = n.shape.rank - 2;
  const std::string br = std::to_string(batch_rank);
  // Which index of a tile the invocations step through first when loading it: the operand's
  // contiguous one (k for A and n for B unless transposed).
  const bool a_k_first = !n.attrs.transpose_a, b_n_first = !n.attrs.transpose_b;
  std::string s = "#version 450\n#extension GL_EXT_control_flow_attributes : require\n";
  s += "layout(local_size_x_id = 0) in;               // NT invocations\n"
       "layout(constant_id = 1) const uint TM = 8u;   // output rows per invocation (a multiple of 4)\n"
       "layout(constant_id = 2) const uint TN4 = 1u;  // output columns per invocation, in vec4s\n"
       "layout(constant_id = 3) const uint BK = 16u;  // the depth of a shared tile\n"
       "layout(constant_id = 4) const uint WN = 8u;   // invocations across a tile's columns\n"
       "layout(constant_id = 5) const uint NT = 64u;  // invocations (the local size)\n"
       "const uint WM = NT / WN, TM4 = TM / 4u, BM4 = WM * TM4, BM = 4u * BM4, BN4 = WN * TN4, BN = 4u * BN4;\n"
       "const uint LA = (BM * BK + NT - 1u) / NT, LB = (BK * BN + NT - 1u) / NT;  // words each invocation loads per tile\n";
  s += bindings(batch_rank, epilogue);
  s += "shared vec4 As[2u * BK * BM4];  // [buffer][k][row / 4]: A's tile, k-major\n"
       "shared vec4 Bs[2u * BK * BN4];  // [buffer][k][column / 4]\n";
  s += "uint M, N, K, oa, ob, m0, n0;\n"
       "float la[LA], lb[LB];\n\n";
  // The tile-local (k, row) of load l, and the same for B's (k, column).
  auto a_index = [&](const char* e) {
    return a_k_first ? std::string("uint kk = ") + e + " % BK, r = " + e + " / BK;" : std::string("uint r = ") + e + " % BM, kk = " + e + " / BM;";
  };
  auto b_index = [&](const char* e) {
    return b_n_first ? std::string("uint c = ") + e + " % BN, kk = " + e + " / BN;" : std::string("uint kk = ") + e + " % BK, c = " + e + " / BK;";
  };
  s += "// Global -> registers: the tile at depth k0, zero outside the matrices.\n"
       "void load_tile(uint k0) {\n"
       "  for (uint l = 0u; l < LA; ++l) {\n"
       "    uint e = gl_LocalInvocationID.x + l * NT;\n"
       "    " + a_index("e") + "\n"
       "    la[l] = (e < BM * BK && m0 + r < M && k0 + kk < K) ? x0[oa + (m0 + r) * pc.p[3] + (k0 + kk) * pc.p[4]] : 0.0;\n"
       "  }\n"
       "  for (uint l = 0u; l < LB; ++l) {\n"
       "    uint e = gl_LocalInvocationID.x + l * NT;\n"
       "    " + b_index("e") + "\n"
       "    lb[l] = (e < BK * BN && n0 + c < N && k0 + kk < K) ? x1[ob + (k0 + kk) * pc.p[5] + (n0 + c) * pc.p[6]] : 0.0;\n"
       "  }\n"
       "}\n\n"
       "// Registers -> shared buffer `buf`.\n"
       "void store_tile(uint buf) {\n"
       "  for (uint l = 0u; l < LA; ++l) {\n"
       "    uint e = gl_LocalInvocationID.x + l * NT;\n"
       "    " + a_index("e") + "\n"
       "    if (e < BM * BK) As[(buf * BK + kk) * BM4 + r / 4u][r % 4u] = la[l];\n"
       "  }\n"
       "  for (uint l = 0u; l < LB; ++l) {\n"
       "    uint e = gl_LocalInvocationID.x + l * NT;\n"
       "    " + b_index("e") + "\n"
       "    if (e < BK * BN) Bs[(buf * BK + kk) * BN4 + c / 4u][c % 4u] = lb[l];\n"
       "  }\n"
       "}\n\n";
  s += "void main() {\n"
       "  M = pc.p[0]; N = pc.p[1]; K = pc.p[2];\n"
       "  uint tx = gl_LocalInvocationID.x % WN, ty = gl_LocalInvocationID.x / WN;\n"
       "  m0 = gl_WorkGroupID.y * BM; n0 = gl_WorkGroupID.x * BN;\n"
       "  uint batch = gl_WorkGroupID.z, rem = batch;\n"
       "  oa = 0u; ob = 0u;\n";
  s += batch_offsets(batch_rank);
  s += "  qkv_epilogue_batch(batch);\n";
  s += "  // Invocation (ty, tx) owns rows 4 (ty + i WM) + 0..3 for i < TM4 and columns\n"
       "  // 4 (tx + j WN) + 0..3 for j < TN4: neighbours read neighbouring vec4s of B.\n"
       "  vec4 acc[TM * TN4];\n"
       "  [[unroll]] for (uint i = 0u; i < TM * TN4; ++i) acc[i] = vec4(0.0);\n"
       "  uint tiles = (K + BK - 1u) / BK;\n"
       "  load_tile(0u);\n"
       "  store_tile(0u);\n"
       "  barrier();\n"
       "  for (uint t = 0u; t < tiles; ++t) {\n"
       "    uint buf = t & 1u;\n"
       "    if (t + 1u < tiles) load_tile((t + 1u) * BK);  // in flight while this tile is multiplied\n"
       "    for (uint kk = 0u; kk < BK; ++kk) {\n"
       "      vec4 b[TN4];\n"
       "      [[unroll]] for (uint j = 0u; j < TN4; ++j) b[j] = Bs[(buf * BK + kk) * BN4 + tx + j * WN];\n"
       "      [[unroll]] for (uint i = 0u; i < TM4; ++i) {\n"
       "        vec4 a = As[(buf * BK + kk) * BM4 + ty + i * WM];\n"
       "        [[unroll]] for (uint j = 0u; j < TN4; ++j) {\n"
       "          acc[(4u * i) * TN4 + j] = fma(vec4(a.x), b[j], acc[(4u * i) * TN4 + j]);\n"
       "          acc[(4u * i + 1u) * TN4 + j] = fma(vec4(a.y), b[j], acc[(4u * i + 1u) * TN4 + j]);\n"
       "          acc[(4u * i + 2u) * TN4 + j] = fma(vec4(a.z), b[j], acc[(4u * i + 2u) * TN4 + j]);\n"
       "          acc[(4u * i + 3u) * TN4 + j] = fma(vec4(a.w), b[j], acc[(4u * i + 3u) * TN4 + j]);\n"
       "        }\n"
       "      }\n"
       "    }\n"
       "    // The other buffer was last read before the previous barrier: safe to fill.\n"
       "    if (t + 1u < tiles) store_tile(buf ^ 1u);\n"
       "    barrier();\n"
       "  }\n"
       "  uint oy = batch * M * N;\n"
       "  [[unroll]] for (uint i = 0u; i < TM4; ++i)\n"
       "    [[unroll]] for (uint c = 0u; c < 4u; ++c) {\n"
       "      uint row = m0 + 4u * (ty + i * WM) + c;\n"
       "      if (row >= M) continue;\n"
       "      [[unroll]] for (uint j = 0u; j < TN4; ++j) {\n"
       "        uint col = n0 + 4u * (tx + j * WN);\n"
       "        vec4 v = acc[(4u * i + c) * TN4 + j];\n"
       "        for (uint q = 0u; q < 4u && col + q < N; ++q) y[oy + row * N + col + q] = qkv_epilogue(v[q], row, col + q);\n"
       "      }\n"
       "    }\n"
       "}\n";
  std::string name = "matmul_b" + br + (n.attrs.transpose_a ? "_ta" : "") + (n.attrs.transpose_b ? "_tb" : "");
  return named({name, s, 3}, epilogue);
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
KernelSource matmul_lanes_source(const Node& n, std::uint32_t sg, const MatmulEpilogue* epilogue) {
  const int batch_rank = n.shape.rank - 2;
  const std::uint32_t rows = kLaneRowGroups * sg, cols = kLaneColumns;
  const auto str = [](std::uint32_t v) { return std::to_string(v); };
  std::string s = "#version 450\n#extension GL_KHR_shader_subgroup_basic : require\n#extension GL_KHR_shader_subgroup_ballot : require\n";
  s += "layout(local_size_x_id = 0) in;  // whole subgroups of " + str(sg) + " lanes\n";
  s += "// The tile, per launch (lanes_tile): RG groups of " + str(sg) + " rows by " + str(sg) + " TN columns per subgroup. The\n"
       "// code below is unrolled for the largest tile; what a smaller one does not use is folded away.\n";
  s += "layout(constant_id = 1) const uint RG = " + str(kLaneRowGroups) + "u;\nlayout(constant_id = 2) const uint TN = " + str(kLaneColumns) + "u;\n";
  s += bindings(batch_rank, epilogue);
  s += "// A subgroup computes RG * " + str(sg) + " rows by TN * " + str(sg) + " columns; lane l owns columns c0 + j * " + str(sg) + " + l.\n";
  s += "void main() {\n"
       "  uint M = pc.p[0], N = pc.p[1], K = pc.p[2];\n"
       "  if (M == 0u || N == 0u) return;\n"
       "  uint lane = gl_SubgroupInvocationID;\n"
       "  uint r0 = (gl_WorkGroupID.y * gl_NumSubgroups + gl_SubgroupID) * (RG * " + str(sg) + "u), c0 = gl_WorkGroupID.x * (TN * " + str(sg) + "u);\n"
       "  if (r0 >= M) return;  // a subgroup wholly past the last row (no barrier waits for it)\n"
       "  uint batch = gl_WorkGroupID.z, rem = batch, oa = 0u, ob = 0u;\n";
  s += batch_offsets(batch_rank);
  s += "  qkv_epilogue_batch(batch);\n";
  s += "  // Rows and columns past the matrix (or the tile) read its last one (so every load is in bounds) and count as 0.\n";
  for (std::uint32_t i = 0; i < kLaneRowGroups; ++i)
    s += "  uint ra" + str(i) + " = r0 + " + str(i * sg) + "u + lane; bool ka" + str(i) + " = " + str(i) + "u < RG && ra" + str(i) + " < M; uint pa" + str(i) +
         " = oa + min(ra" + str(i) + ", M - 1u) * pc.p[3];\n";
  for (std::uint32_t j = 0; j < cols; ++j)
    s += "  uint cb" + str(j) + " = c0 + " + str(j * sg) + "u + lane; bool kb" + str(j) + " = " + str(j) + "u < TN && cb" + str(j) + " < N; uint pb" + str(j) +
         " = ob + min(cb" + str(j) + ", N - 1u) * pc.p[6];\n";
  for (std::uint32_t r = 0; r < rows; ++r) {
    s += "  float";
    for (std::uint32_t j = 0; j < cols; ++j) s += std::string(j ? "," : "") + " c" + str(r) + "_" + str(j) + " = 0.0";
    s += ";\n";
  }
  s += "  for (uint k = 0u; k < K; ++k) {\n";
  for (std::uint32_t i = 0; i < kLaneRowGroups; ++i)
    s += "    float a" + str(i) + " = 0.0; if (" + str(i) + "u < RG) { a" + str(i) + " = x0[pa" + str(i) + " + k * pc.p[4]]; a" + str(i) + " = ka" + str(i) + " ? a" +
         str(i) + " : 0.0; }\n";
  for (std::uint32_t j = 0; j < cols; ++j)
    s += "    float b" + str(j) + " = 0.0; if (" + str(j) + "u < TN) { b" + str(j) + " = x1[pb" + str(j) + " + k * pc.p[5]]; b" + str(j) + " = kb" + str(j) + " ? b" +
         str(j) + " : 0.0; }\n";
  for (std::uint32_t r = 0; r < rows; ++r) {
    s += "    if (" + str(r / sg) + "u < RG) { float a = subgroupBroadcast(a" + str(r / sg) + ", " + str(r % sg) + "u);";
    for (std::uint32_t j = 0; j < cols; ++j)
      s += (j ? " if (" + str(j) + "u < TN)" : std::string()) + " c" + str(r) + "_" + str(j) + " = fma(a, b" + str(j) + ", c" + str(r) + "_" + str(j) + ");";
    s += " }\n";
  }
  s += "  }\n  uint oy = batch * M * N;\n";
  for (std::uint32_t r = 0; r < rows; ++r) {
    s += "  if (" + str(r / sg) + "u < RG && r0 + " + str(r) + "u < M) {";
    for (std::uint32_t j = 0; j < cols; ++j) s += " if (kb" + str(j) + ") y[oy + (r0 + " + str(r) + "u) * N + cb" + str(j) + "] = qkv_epilogue(c" + str(r) + "_" + str(j) + ", r0 + " + str(r) + "u, cb" + str(j) + ");";
    s += " }\n";
  }
  s += "}\n";
  std::string name = "matmul_lanes" + str(sg) + "_b" + std::to_string(batch_rank) + (n.attrs.transpose_a ? "_ta" : "") + (n.attrs.transpose_b ? "_tb" : "");
  return named({name, s, 3}, epilogue);
}

}  // namespace

KernelSource matmul_source(const Node& n, const Target& target, const MatmulEpilogue* epilogue) {
  return uses_lanes(target) ? matmul_lanes_source(n, target.subgroup_size, epilogue) : matmul_tiled_source(n, epilogue);
}

KernelLaunch matmul_launch(const Node& n, const std::vector<Shape>& shapes, const Shape& os, const Target& target) {
  const Shape& as = shapes[static_cast<std::size_t>(n.inputs[0])];
  const Shape& bs = shapes[static_cast<std::size_t>(n.inputs[1])];
  const bool ta = n.attrs.transpose_a, tb = n.attrs.transpose_b;
  const std::int64_t m = os.back(1), nn = os.back(0), k = ta ? as.back(1) : as.back(0);
  KernelLaunch l;
  l.push = {push_word(m), push_word(nn), push_word(k), push_word(ta ? 1 : k), push_word(ta ? m : 1), push_word(tb ? 1 : nn), push_word(tb ? k : 1)};
  Shape batch, ab, bb;
  for (int i = 0; i + 2 < os.rank; ++i) batch.push_back(os[i]);
  for (int i = 0; i + 2 < as.rank; ++i) ab.push_back(as[i]);
  for (int i = 0; i + 2 < bs.rank; ++i) bb.push_back(bs[i]);
  auto sa = broadcast_strides(ab, batch.rank), sb = broadcast_strides(bb, batch.rank);
  for (int i = 0; i < batch.rank; ++i) l.push.push_back(push_word(batch[i]));
  for (int i = 0; i < batch.rank; ++i) l.push.push_back(push_word(sa[static_cast<std::size_t>(i)] * m * k));
  for (int i = 0; i < batch.rank; ++i) l.push.push_back(push_word(sb[static_cast<std::size_t>(i)] * k * nn));
  if (uses_lanes(target)) {
    const std::uint32_t sg = target.subgroup_size;
    const LaneTile t = lanes_tile(m, nn, sg);
    const std::int64_t rows = t.row_groups * t.subgroups * sg, cols = t.columns * sg;
    l.groups = {push_word(std::max<std::int64_t>(1, (nn + cols - 1) / cols)), push_word(std::max<std::int64_t>(1, (m + rows - 1) / rows)),
                push_word(batch.numel())};
    l.specialization = {t.subgroups * sg, t.row_groups, t.columns};
    return l;
  }
  const MatmulGeometry g = matmul_geometry(target, m, nn);
  l.groups = {push_word(std::max<std::int64_t>(1, (nn + g.bn() - 1) / g.bn())), push_word(std::max<std::int64_t>(1, (m + g.bm() - 1) / g.bm())),
              push_word(batch.numel())};
  l.specialization = {g.invocations, g.tm, g.tn4, g.bk, g.wn, g.invocations};
  return l;
}

}  // namespace detail
}  // namespace qkv::codegen
