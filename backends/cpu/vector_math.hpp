// Vectorisable math for the CPU kernels.
#pragma once

#include <cstdint>

namespace qkv::backend::cpu {

/// x[i] = exp(x[i] - shift) for i < n; returns the sum of the results. A polynomial exp (Cephes
/// coefficients, about 2 ulp) that the compiler vectorises; inputs below -87.3 (and -inf) give exactly 0,
/// NaN gives NaN.
float exp_shifted_sum(float* x, std::int64_t n, float shift);

/// The online softmax's step over `rows` rows of a score tile (row r at s + r * ld, n scores):
/// max[r] = max_of(row, n, top[r]), then the row becomes exp(row - max[r]) and sums[r] its sum
/// (exp_shifted_sum), or zeros and 0 where max[r] is -inf (every score masked). The same bits as
/// those calls row by row, computed for all rows at once: a small tile's rows, one after another,
/// each waited on its own exp and sum.
void online_softmax_rows(float* s, std::int64_t ld, std::int64_t rows, std::int64_t n, const float* top, float* max, float* sums);

/// The lanes of online_softmax_tangent_rows' product sums: their association, the same on every
/// ISA.
inline constexpr int kProductLanes = 16;

/// Forward mode's online-softmax step over a tile (as online_softmax_rows) with the scores'
/// tangents t (row r at t + r * ld): first t *= dmod where a modifier's derivative is given, and
/// t = 0 where the score is -inf (a masked score has no tangent); then online_softmax_rows on s;
/// then t *= the row's exps and products[r] = their sum, each product added into lane j mod
/// kProductLanes, then the lanes in order (0 where max[r] is -inf). The same bits as those steps
/// row by row.
void online_softmax_tangent_rows(float* s, float* t, const float* dmod, std::int64_t ld, std::int64_t rows, std::int64_t n, const float* top,
                                 float* max, float* sums, float* products);

/// x[i] = exp(x[i] - shift) for i < n, the same exp as exp_shifted_sum.
void exp_shifted(float* x, std::int64_t n, float shift);

/// y[i] = p[i] * (y[i] - c) for i < n (attention's backward: ds = p (dp - delta)).
void times_difference(float* y, const float* p, std::int64_t n, float c);

/// The maximum of init and x[0..n); NaN if any of them is NaN (NaN propagates as in max).
float max_of(const float* x, std::int64_t n, float init);

/// Whether no x[i], i < n, is NaN or an infinity.
bool all_finite(const float* x, std::int64_t n);

/// y[i] /= d for i < n (a division, not a multiplication by 1/d, which rounds twice).
void divide_inplace(float* y, std::int64_t n, float d);

/// y[i] *= s for i < n.
void scale_inplace(float* y, std::int64_t n, float s);

/// y[i] = tanh(x[i]) for i < n (x == y allowed): a few ulp, vectorised (series near 0, exp
/// beyond), NaN gives NaN. Soft-capping evaluates it on every score.
void tanh_of(const float* x, float* y, std::int64_t n);

/// y[i] = erf(x[i]) for i < n (x == y allowed): vectorised, within 2e-7 of erf, the same
/// algorithm as the vulkan backend's (see erf_v); NaN gives NaN.
void erf_of(const float* x, float* y, std::int64_t n);

/// y[i] = exp(x[i]) for i < n (x == y allowed), the same exp as exp_shifted_sum (0 below
/// -87.3, +inf above 88.72).
void exp_of(const float* x, float* y, std::int64_t n);

/// The sum of x[0..n), accumulated per lane in float over four vectors, then in double.
float sum_of(const float* x, std::int64_t n);

/// Soft-capping in one pass: s[i] = cap * t with t = tanh(s[i] / cap) and, when dmod is given,
/// dmod[i] = 1 - t * t (its derivative); the same tanh as tanh_of. The cpu's score modifier
/// takes this path for a region that is exactly cap * tanh(score / cap).
void softcap_row(float* s, float* dmod, std::int64_t n, float cap);

/// z[j] = dropout_mask's factor for element index + j, j < n: 0 where Philox4x32-10 (keyed by
/// seed, ir/random.hpp) falls below threshold, else keep = 1/(1-p). Vectorised across elements.
void dropout_factors(std::uint32_t seed, std::uint32_t threshold, float keep, std::uint32_t index, float* z, std::int64_t n);

}  // namespace qkv::backend::cpu
