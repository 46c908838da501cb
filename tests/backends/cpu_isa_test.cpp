// The cpu backend's vector kernels, on whichever instruction set this CPU gets (QKV_CPU_ISA caps
// it: CTest runs this file and the cpu's fused-attention tests again under avx2 and baseline, so
// an AVX-512 machine checks all three copies).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <random>
#include <string_view>
#include <thread>
#include <vector>

#include "backends/cpu/gemm.hpp"
#include "backends/cpu/gemv.hpp"
#include "backends/cpu/isa.hpp"
#include "backends/cpu/kernels.hpp"
#include "backends/cpu/thread_pool.hpp"
#include "backends/cpu/tile_gemm.hpp"
#include "backends/cpu/vector_math.hpp"
#include "ir/half.hpp"
#include "ir/random.hpp"

namespace qkv::backend::cpu {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN(), kInf = std::numeric_limits<float>::infinity();

/// Lengths that leave every tail: shorter than a vector of each width, between, and longer.
const std::int64_t kLengths[] = {1, 5, 8, 13, 16, 31, 64, 77};

std::vector<float> ramp(std::int64_t n, float lo, float hi) {
  std::vector<float> x(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) x[static_cast<std::size_t>(i)] = lo + (hi - lo) * static_cast<float>(i) / static_cast<float>(n);
  return x;
}

TEST(CpuIsa, TheCapIsHonoured) {
  const char* cap = std::getenv("QKV_CPU_ISA");
  const std::string_view c = cap ? cap : "";
  if (c == "baseline") {
    EXPECT_EQ(host_isa(), Isa::baseline);
  } else if (c == "avx2") {
    EXPECT_NE(host_isa(), Isa::avx512);
  }
  RecordProperty("isa", isa_name(host_isa()));
  std::printf("vector kernels: %s\n", isa_name(host_isa()));
}

TEST(CpuIsa, ExpAndTanhMatchTheLibmOnEveryTail) {
  for (std::int64_t n : kLengths) {
    std::vector<float> x = ramp(n, -20.0f, 5.0f), y = x;
    const float shift = 1.5f;
    double want = 0;
    for (float v : x) want += std::exp(static_cast<double>(v) - shift);
    const float sum = exp_shifted_sum(y.data(), n, shift);
    EXPECT_NEAR(sum, want, 1e-6 * want) << n;
    for (std::int64_t i = 0; i < n; ++i) {
      const float e = std::exp(x[static_cast<std::size_t>(i)] - shift);
      EXPECT_NEAR(y[static_cast<std::size_t>(i)], e, 4e-7f * e) << n << " " << i;
    }
    std::vector<float> t(static_cast<std::size_t>(n));
    tanh_of(x.data(), t.data(), n);
    for (std::int64_t i = 0; i < n; ++i) EXPECT_NEAR(t[static_cast<std::size_t>(i)], std::tanh(x[static_cast<std::size_t>(i)]), 3e-7f) << n;
  }
  // exp: -inf and far below give 0, far above +inf, NaN stays NaN; tanh keeps NaN.
  std::vector<float> special = {-kInf, -100.0f, 100.0f, kNaN, 0.0f, -kInf, 1.0f, kNaN, 2.0f};
  exp_shifted(special.data(), static_cast<std::int64_t>(special.size()), 0.0f);
  EXPECT_EQ(special[0], 0.0f);
  EXPECT_EQ(special[1], 0.0f);
  EXPECT_EQ(special[2], kInf);
  EXPECT_TRUE(std::isnan(special[3]));
  EXPECT_EQ(special[4], 1.0f);
  EXPECT_TRUE(std::isnan(special[7]));
}

/// The specialised soft-capping pass is cap * tanh(s / cap), its derivative 1 - tanh^2, NaN kept.
TEST(CpuIsa, ErfExpAndSumMatchTheLibmOnEveryTail) {
  // erf on both sides of the switch at |x| = 1 and far into its tails, exp up to overflow, each
  // length leaving every vector tail; NaN stays NaN in every lane.
  for (std::int64_t n : kLengths) {
    for (const auto& [lo, hi] : {std::pair{-0.99f, 0.99f}, std::pair{-6.0f, 6.0f}}) {
      const std::vector<float> x = ramp(n, lo, hi);
      std::vector<float> y(x.size());
      erf_of(x.data(), y.data(), n);
      for (std::int64_t i = 0; i < n; ++i) {
        const double want = std::erf(static_cast<double>(x[static_cast<std::size_t>(i)]));
        EXPECT_NEAR(y[static_cast<std::size_t>(i)], want, 2e-7 * std::abs(want) + 1e-38) << n << " " << x[static_cast<std::size_t>(i)];
      }
    }
    std::vector<float> x = ramp(n, -90.0f, 89.0f), y(static_cast<std::size_t>(n));
    exp_of(x.data(), y.data(), n);
    for (std::int64_t i = 0; i < n; ++i) {
      const float v = x[static_cast<std::size_t>(i)], e = std::exp(v), got = y[static_cast<std::size_t>(i)];
      if (v < -87.3f) EXPECT_EQ(got, 0.0f) << v;
      else if (std::isinf(e)) EXPECT_TRUE(std::isinf(got)) << v;
      else EXPECT_NEAR(got, e, 4e-7f * e) << n << " " << v;
    }
    // exp's ends: 88.72 is finite (2^128 times a factor under 1), past it +inf; below -87.3, 0.
    const std::vector<float> ends = {88.3f, 88.5f, 88.7f, 88.72f, 88.73f, 89.0f, -87.0f, -87.4f, -100.0f};
    std::vector<float> e_out(ends.size());
    exp_of(ends.data(), e_out.data(), static_cast<std::int64_t>(ends.size()));
    for (std::size_t i = 0; i < ends.size(); ++i) {
      const float v = ends[i], e = std::exp(v);
      if (v < -87.3f) EXPECT_EQ(e_out[i], 0.0f) << v;
      else if (std::isinf(e)) EXPECT_TRUE(std::isinf(e_out[i])) << v;
      else EXPECT_NEAR(e_out[i], e, 4e-7f * e) << v;
    }
    x = ramp(n, -3.0f, 5.0f);
    double want = 0;
    for (float v : x) want += v;
    EXPECT_NEAR(sum_of(x.data(), n), want, 1e-6 * (std::abs(want) + n)) << n;
    for (std::int64_t i = 0; i < n; ++i) {
      std::vector<float> z = ramp(n, -2.0f, 2.0f);
      z[static_cast<std::size_t>(i)] = kNaN;
      erf_of(z.data(), z.data(), n);
      EXPECT_TRUE(std::isnan(z[static_cast<std::size_t>(i)])) << n << " " << i;
    }
  }
}

TEST(CpuIsa, SoftcapRowIsCapTimesTanh) {
  for (std::int64_t n : kLengths) {
    std::vector<float> x = ramp(n, -200.0f, 200.0f);
    x[0] = kNaN;
    std::vector<float> s = x, d(static_cast<std::size_t>(n)), plain = x;
    softcap_row(s.data(), d.data(), n, 30.0f);
    softcap_row(plain.data(), nullptr, n, 30.0f);
    for (std::int64_t i = 0; i < n; ++i) {
      const auto k = static_cast<std::size_t>(i);
      const double t = std::tanh(static_cast<double>(x[k]) / 30.0);
      if (std::isnan(x[k])) {
        EXPECT_TRUE(std::isnan(s[k]) && std::isnan(d[k]));
        continue;
      }
      EXPECT_NEAR(s[k], 30.0 * t, 1e-5) << n << " " << i;
      EXPECT_NEAR(d[k], 1.0 - t * t, 1e-6) << n << " " << i;
      EXPECT_EQ(plain[k], s[k]);
    }
  }
}

TEST(CpuIsa, RowHelpersAndNaNInEveryLane) {
  for (std::int64_t n : kLengths) {
    std::vector<float> x = ramp(n, -3.0f, 3.0f);
    EXPECT_EQ(max_of(x.data(), n, -kInf), x.back()) << n;
    for (std::int64_t at = 0; at < n; ++at) {  // a NaN anywhere, vector lanes and tail alike
      std::vector<float> y = x;
      y[static_cast<std::size_t>(at)] = kNaN;
      EXPECT_TRUE(std::isnan(max_of(y.data(), n, -kInf))) << n << " " << at;
    }
    std::vector<float> y = x, p = ramp(n, 0.0f, 1.0f);
    times_difference(y.data(), p.data(), n, 0.5f);
    for (std::int64_t i = 0; i < n; ++i)
      EXPECT_FLOAT_EQ(y[static_cast<std::size_t>(i)], p[static_cast<std::size_t>(i)] * (x[static_cast<std::size_t>(i)] - 0.5f));
    y = x;
    divide_inplace(y.data(), n, 3.0f);
    for (std::int64_t i = 0; i < n; ++i) EXPECT_EQ(y[static_cast<std::size_t>(i)], x[static_cast<std::size_t>(i)] / 3.0f);
    y = x;
    scale_inplace(y.data(), n, 0.25f);
    for (std::int64_t i = 0; i < n; ++i) EXPECT_EQ(y[static_cast<std::size_t>(i)], x[static_cast<std::size_t>(i)] * 0.25f);
    // binary_row for every op, with either operand uniform.
    for (ir::Op op : {ir::Op::add, ir::Op::sub, ir::Op::mul, ir::Op::div, ir::Op::max, ir::Op::equal, ir::Op::greater}) {
      std::vector<float> out(static_cast<std::size_t>(n));
      for (int uniform : {0, 1, 2}) {
        binary_row(op, x.data(), uniform != 1, p.data(), uniform != 2, out.data(), n);
        for (std::int64_t i = 0; i < n; ++i) {
          const float a = x[uniform == 1 ? 0 : static_cast<std::size_t>(i)], b = p[uniform == 2 ? 0 : static_cast<std::size_t>(i)];
          float want = 0;
          if (op == ir::Op::add) want = a + b;
          else if (op == ir::Op::sub) want = a - b;
          else if (op == ir::Op::mul) want = a * b;
          else if (op == ir::Op::div) want = a / b;
          else if (op == ir::Op::max) want = a > b ? a : b;
          else if (op == ir::Op::equal) want = a == b ? 1.0f : 0.0f;
          else want = a > b ? 1.0f : 0.0f;  // greater
          if (std::isnan(want)) EXPECT_TRUE(std::isnan(out[static_cast<std::size_t>(i)]));
          else EXPECT_EQ(out[static_cast<std::size_t>(i)], want) << ir::op_name(op) << " " << n << " " << i;
        }
      }
    }
  }
}

/// Forward mode's softmax step over a tile: the same bits as its definition taken row by row
/// (max_of, exp_shifted_sum, and the products summed in kProductLanes lanes, in a scalar loop that
/// no ISA changes), with masked scores, a row masked whole, a NaN derivative at a masked score
/// (which must not reach the tangent) and a running max above the tile's.
TEST(CpuIsa, OnlineSoftmaxTangentRowsAreTheRowByRowSteps) {
  constexpr std::int64_t kRows = 3;
  for (std::int64_t n : kLengths) {
    const std::int64_t ld = n + 3;
    std::vector<float> s(static_cast<std::size_t>(kRows * ld)), t(s.size()), dmod(s.size());
    for (std::size_t i = 0; i < s.size(); ++i) {
      s[i] = std::sin(static_cast<float>(i)) * 4.0f;
      t[i] = std::cos(static_cast<float>(i) * 0.7f);
      dmod[i] = 0.5f + 0.25f * std::sin(static_cast<float>(i) * 1.3f);
    }
    for (std::int64_t j = 0; j < n; ++j) s[static_cast<std::size_t>(ld + j)] = -kInf;  // row 1 masked whole
    for (std::int64_t j = 0; j < n; j += 3) {                                          // row 2 masked in part
      s[static_cast<std::size_t>(2 * ld + j)] = -kInf;
      dmod[static_cast<std::size_t>(2 * ld + j)] = kNaN;
    }
    const float top[kRows] = {-kInf, -kInf, 5.0f};
    for (const bool with_dmod : {false, true}) {
      std::vector<float> s_got = s, t_got = t;
      float max[kRows], sums[kRows], products[kRows];
      online_softmax_tangent_rows(s_got.data(), t_got.data(), with_dmod ? dmod.data() : nullptr, ld, kRows, n, top, max, sums, products);
      for (std::int64_t r = 0; r < kRows; ++r) {
        std::vector<float> row(s.begin() + r * ld, s.begin() + r * ld + n), trow(t.begin() + r * ld, t.begin() + r * ld + n);
        for (std::int64_t j = 0; j < n; ++j) {
          float& x = trow[static_cast<std::size_t>(j)];
          if (with_dmod) x *= dmod[static_cast<std::size_t>(r * ld + j)];
          if (row[static_cast<std::size_t>(j)] == -kInf) x = 0.0f;
        }
        const float want_max = max_of(row.data(), n, top[r]);
        EXPECT_EQ(max[r], want_max) << n << " " << r;
        float want_sum = 0.0f, want_products = 0.0f;
        if (want_max == -kInf) {
          std::fill(row.begin(), row.end(), 0.0f);
        } else {
          want_sum = exp_shifted_sum(row.data(), n, want_max);
          float lanes[kProductLanes] = {};
          for (std::int64_t j = 0; j < n; ++j) {
            trow[static_cast<std::size_t>(j)] *= row[static_cast<std::size_t>(j)];
            lanes[j % kProductLanes] += trow[static_cast<std::size_t>(j)];
          }
          for (const float lane : lanes) want_products += lane;
        }
        EXPECT_EQ(sums[r], want_sum) << n << " " << r;
        EXPECT_EQ(products[r], want_products) << n << " " << r << " " << with_dmod;
        for (std::int64_t j = 0; j < n; ++j) {
          EXPECT_EQ(s_got[static_cast<std::size_t>(r * ld + j)], row[static_cast<std::size_t>(j)]) << n << " " << r << " " << j;
          EXPECT_EQ(t_got[static_cast<std::size_t>(r * ld + j)], trow[static_cast<std::size_t>(j)]) << n << " " << r << " " << j;
        }
      }
    }
  }
}

/// The vectorised Philox draws exactly the scalar definition's bits, at any start and length.
TEST(CpuIsa, DropoutFactorsAreTheScalarBits) {
  for (double p : {0.1, 0.5, 0.9}) {
    const std::uint32_t threshold = ir::dropout_threshold(p);
    const float keep = static_cast<float>(ir::dropout_keep_value(p));
    for (std::int64_t n : kLengths)
      for (std::uint32_t index : {0u, 7u, 4294967290u}) {  // the last wraps
        std::vector<float> z(static_cast<std::size_t>(n), -1.0f);
        dropout_factors(12345, threshold, keep, index, z.data(), n);
        for (std::int64_t j = 0; j < n; ++j)
          ASSERT_EQ(z[static_cast<std::size_t>(j)], ir::dropout_keeps(12345, index + static_cast<std::uint32_t>(j), threshold) ? keep : 0.0f)
              << p << " " << n << " " << index << " " << j;
      }
  }
}

TEST(CpuIsa, AllFiniteFindsNaNAndInfinitiesInEveryLane) {
  for (std::int64_t n : kLengths) {
    std::vector<float> x = ramp(n, -1e30f, 1e30f);  // large but finite: x * 0 stays 0
    EXPECT_TRUE(all_finite(x.data(), n)) << n;
    for (std::int64_t i = 0; i < n; ++i)
      for (const float bad : {kNaN, kInf, -kInf}) {
        std::vector<float> y = x;
        y[static_cast<std::size_t>(i)] = bad;
        EXPECT_FALSE(all_finite(y.data(), n)) << n << " " << i << " " << bad;
      }
  }
  EXPECT_TRUE(all_finite(nullptr, 0));
}

TEST(CpuIsa, TileGemmIsTheProductOnEveryTail) {
  // m leaves every row tail of the register tiles (8 rows); n every column tail of one and two
  // vectors of 16 lanes (the last columns go to OpenBLAS, as all do below AVX-512); k includes 0.
  const std::int64_t ms[] = {1, 5, 6, 7, 8, 13, 17, 24};
  const std::int64_t ns[] = {1, 7, 8, 16, 24, 32, 40, 48, 64, 70};
  const std::int64_t ks[] = {0, 1, 3, 64};
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  for (const bool transposed : {false, true})
    for (const bool accumulate : {false, true})
      for (const std::int64_t m : ms)
        for (const std::int64_t n : ns)
          for (const std::int64_t k : ks) {
            // Leading dimensions wider than the matrices, so a stride mix-up reads other values.
            const std::int64_t lda = (transposed ? m : k) + 3, ldb = n + 5, ldc = n + 2;
            std::vector<float> a(static_cast<std::size_t>((transposed ? k : m) * lda + 1)), b(static_cast<std::size_t>(k * ldb + 1)),
                c(static_cast<std::size_t>(m * ldc));
            for (float& x : a) x = uniform(rng);
            for (float& x : b) x = uniform(rng);
            for (float& x : c) x = uniform(rng);
            std::vector<float> want = c;
            const float alpha = 0.75f;
            for (std::int64_t i = 0; i < m; ++i)
              for (std::int64_t j = 0; j < n; ++j) {
                double sum = 0;
                for (std::int64_t p = 0; p < k; ++p)
                  sum += static_cast<double>(transposed ? a[static_cast<std::size_t>(p * lda + i)] : a[static_cast<std::size_t>(i * lda + p)]) *
                         b[static_cast<std::size_t>(p * ldb + j)];
                float& w = want[static_cast<std::size_t>(i * ldc + j)];
                w = static_cast<float>(alpha * sum + (accumulate ? w : 0.0f));
              }
            tile_gemm(transposed, m, n, k, alpha, a.data(), lda, b.data(), ldb, accumulate, c.data(), ldc);
            for (std::int64_t i = 0; i < m; ++i)
              for (std::int64_t j = 0; j < ldc; ++j) {
                const std::size_t e = static_cast<std::size_t>(i * ldc + j);
                // Columns past n are left alone; the rest within k terms' rounding.
                ASSERT_NEAR(c[e], want[e], j < n ? 1e-6 * (static_cast<double>(k) + 2) : 0.0)
                    << "transposed " << transposed << " accumulate " << accumulate << " m " << m << " n " << n << " k " << k << " at " << i << ","
                    << j;
              }
          }
}

/// A B operand as a half checkpoint holds it: `b` rounded in place to `stored` (the values a kernel
/// reading it should see) and its 16-bit copies; at(i) points at element i in `stored`.
struct StoredB {
  DType stored;
  std::vector<float>& b;
  std::vector<Half> f16;
  std::vector<BFloat16> bf16;
  StoredB(DType stored_as, std::vector<float>& values) : stored(stored_as), b(values), f16(values.size()), bf16(values.size()) {
    const auto n = static_cast<std::int64_t>(b.size());
    to_half(b.data(), f16.data(), n);
    to_bfloat16(b.data(), bf16.data(), n);
    if (stored == DType::f16) to_float(f16.data(), b.data(), n);
    if (stored == DType::bf16) to_float(bf16.data(), b.data(), n);
  }
  const void* at(std::size_t i) const {
    if (stored == DType::f16) return f16.data() + i;
    if (stored == DType::bf16) return bf16.data() + i;
    return b.data() + i;
  }
};

TEST(CpuIsa, GemmIsTheProductInEveryLayoutDtypeAndTail) {
  // The backend's packed GEMM: m and n leave every row and column tail of both register tiles
  // (12 x 32 on AVX-512, 6 x 16 on AVX2) and split over threads; k = 0, one term, and more than
  // one block of 256 terms; n past one packed panel of B (4096 columns: two column blocks); a block
  // of rows taller than one packed block of A (192 rows on AVX-512); A and B each as stored or
  // transposed, B in f32, f16 and bf16 (read as stored), a batch of entries with their own operands.
  struct Dims {
    std::int64_t m, n, k;
  };
  const Dims dims[] = {{1, 1, 1}, {5, 7, 0}, {6, 16, 3}, {13, 33, 17}, {25, 47, 300}, {40, 130, 513}, {7, 4100, 9}, {97, 65, 64}, {500, 40, 20}};
  std::mt19937 rng(13);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  for (const DType stored : {DType::f32, DType::f16, DType::bf16})
    for (const bool ta : {false, true})
      for (const bool tb : {false, true})
        for (const Dims& d : dims) {
          const std::int64_t batch = 2;
          // Leading dimensions wider than the matrices, so a stride mix-up reads other values.
          const std::int64_t lda = (ta ? d.m : d.k) + 3, ldb = (tb ? d.k : d.n) + 5, ldc = d.n + 2;
          const std::int64_t a_size = (ta ? d.k : d.m) * lda + 1, b_size = (tb ? d.n : d.k) * ldb + 1, c_size = d.m * ldc;
          std::vector<float> a(static_cast<std::size_t>(batch * a_size)), b(static_cast<std::size_t>(batch * b_size));
          for (float& v : a) v = uniform(rng);
          for (float& v : b) v = uniform(rng);
          const StoredB held(stored, b);
          std::vector<float> c(static_cast<std::size_t>(batch * c_size), kNaN);
          std::vector<GemmOperands> entries;
          for (std::int64_t e = 0; e < batch; ++e)
            entries.push_back({a.data() + e * a_size, held.at(static_cast<std::size_t>(e * b_size)), c.data() + e * c_size});
          gemm({d.m, d.n, d.k, ta, tb, lda, ldb, ldc, stored}, entries);
          for (std::int64_t e = 0; e < batch; ++e)
            for (std::int64_t i = 0; i < d.m; ++i)
              for (std::int64_t j = 0; j < ldc; ++j) {
                const float got = c[static_cast<std::size_t>(e * c_size + i * ldc + j)];
                if (j >= d.n) {  // columns past n are left alone
                  ASSERT_TRUE(std::isnan(got));
                  continue;
                }
                double sum = 0, scale = 0;
                for (std::int64_t p = 0; p < d.k; ++p) {
                  const double x = a[static_cast<std::size_t>(e * a_size + (ta ? p * lda + i : i * lda + p))];
                  const double y = b[static_cast<std::size_t>(e * b_size + (tb ? j * ldb + p : p * ldb + j))];
                  sum += x * y;
                  scale += std::abs(x * y);
                }
                ASSERT_NEAR(got, sum, 1e-6 * (scale + 1)) << "dtype " << dtype_name(stored) << " ta " << ta << " tb " << tb << " m " << d.m << " n "
                                                          << d.n << " k " << d.k << " entry " << e << " at " << i << "," << j;
              }
        }
}

TEST(CpuIsa, GemmSumsEachElementInTheSameOrderHoweverTheWorkIsSplit) {
  // Determinism: an element's sum does not depend on which block or thread computes it, so the
  // product of a column range of B (a different split of the work) is bitwise the same. (Not on
  // the baseline ISA, where each block is OpenBLAS's sgemm and its order follows the block's shape.)
  if (!own_gemm_available()) GTEST_SKIP() << "the baseline ISA's GEMM is OpenBLAS";
  const std::int64_t m = 70, n = 600, k = 700;
  std::mt19937 rng(17);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  std::vector<float> a(static_cast<std::size_t>(m * k)), b(static_cast<std::size_t>(k * n)), whole(static_cast<std::size_t>(m * n)),
      part(static_cast<std::size_t>(m * n), 0.0f);
  for (float& v : a) v = uniform(rng);
  for (float& v : b) v = uniform(rng);
  const GemmOperands all{a.data(), b.data(), whole.data()};
  gemm({m, n, k, false, false, k, n, n, DType::f32}, {&all, 1});
  const std::int64_t first = 37, cols = 100;  // not on a strip or block boundary
  const GemmOperands some{a.data(), b.data() + first, part.data() + first};
  gemm({m, cols, k, false, false, k, n, n, DType::f32}, {&some, 1});
  for (std::int64_t i = 0; i < m; ++i)
    for (std::int64_t j = first; j < first + cols; ++j)
      ASSERT_EQ(part[static_cast<std::size_t>(i * n + j)], whole[static_cast<std::size_t>(i * n + j)]) << i << "," << j;
}

TEST(CpuIsa, AParallelForInsideATaskRunsOnTheTasksThread) {
  // A kernel that spreads its own work over the pool (an elementwise op's chunks, a GEMM) may be
  // called from another kernel's task: the inner loop runs inline instead of waiting on the pool
  // (which deadlocked).
  ThreadPool& pool = ThreadPool::global();
  std::vector<std::int64_t> sums(8, 0);
  pool.parallel_for(8, [&](std::int64_t t) {
    const auto outer = std::this_thread::get_id();
    pool.parallel_for(100, [&](std::int64_t i) {
      EXPECT_EQ(std::this_thread::get_id(), outer);
      sums[static_cast<std::size_t>(t)] += i;
    });
  });
  for (std::int64_t s : sums) EXPECT_EQ(s, 4950);
}

TEST(CpuIsa, FewRowsProductIsTheProductInEveryLayoutAndDtype) {
  // Decode steps' matmuls: 1 to 4 rows times B [k, n] or its transpose [n, k] in f32, f16 and
  // bf16, read as stored. k and n leave every vector and column-group tail, and the larger ones
  // split B over several tasks (rows of B summed in blocks, or column blocks).
  const std::int64_t ks[] = {0, 1, 13, 64, 77, 1500};
  const std::int64_t ns[] = {0, 1, 3, 5, 17, 300, 3001};
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  for (const DType stored : {DType::f32, DType::f16, DType::bf16})
    for (const bool transposed : {false, true})
      for (const std::int64_t rows : {1, 2, 3, 4})
        for (const std::int64_t k : ks)
          for (const std::int64_t n : ns) {
            if (k * n > 600000 && rows > 1) continue;  // the large shapes once per layout
            std::vector<float> x(static_cast<std::size_t>(rows * k)), b(static_cast<std::size_t>(k * n));
            for (float& v : x) v = uniform(rng);
            for (float& v : b) v = uniform(rng);
            const StoredB held(stored, b);  // what the kernel should read: B's elements as stored
            const void* stored_b = held.at(0);
            std::vector<float> out(static_cast<std::size_t>(rows * n), kNaN);
            few_rows_product(x.data(), rows, k, n, stored_b, stored, transposed, out.data());
            for (std::int64_t r = 0; r < rows; ++r)
              for (std::int64_t c = 0; c < n; ++c) {
                double want = 0, scale = 0;
                for (std::int64_t j = 0; j < k; ++j) {
                  const double term =
                      static_cast<double>(x[static_cast<std::size_t>(r * k + j)]) * b[static_cast<std::size_t>(transposed ? c * k + j : j * n + c)];
                  want += term;
                  scale += std::abs(term);
                }
                ASSERT_NEAR(out[static_cast<std::size_t>(r * n + c)], want, 1e-6 * scale + 1e-30)
                    << dtype_name(stored) << " transposed " << transposed << " rows " << rows << " k " << k << " n " << n << " at " << r << "," << c;
              }
          }
}

TEST(CpuIsa, TransposeIntoPadsWithZeros) {
  for (const std::int64_t rows : {1, 7, 8, 9, 16, 21})
    for (const std::int64_t cols : {1, 8, 13, 64}) {
      const std::int64_t ldx = cols + 3, padded = rows + 5, ldy = padded + 2;
      std::vector<float> x(static_cast<std::size_t>(rows * ldx));
      for (std::size_t e = 0; e < x.size(); ++e) x[e] = static_cast<float>(e) + 0.5f;
      std::vector<float> y(static_cast<std::size_t>(cols * ldy), kNaN);
      transpose_into(x.data(), rows, cols, ldx, y.data(), ldy, padded);
      for (std::int64_t j = 0; j < cols; ++j)
        for (std::int64_t i = 0; i < ldy; ++i) {
          const float got = y[static_cast<std::size_t>(j * ldy + i)];
          if (i < rows) ASSERT_EQ(got, x[static_cast<std::size_t>(i * ldx + j)]) << rows << "x" << cols << " at " << i << "," << j;
          else if (i < padded) ASSERT_EQ(got, 0.0f) << rows << "x" << cols << " at " << i << "," << j;
          else ASSERT_TRUE(std::isnan(got)) << "wrote past the padding: " << rows << "x" << cols << " at " << i << "," << j;
        }
    }
}

}  // namespace
}  // namespace qkv::backend::cpu
