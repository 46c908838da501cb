// Attention building blocks written with the DSL's primitives.
#pragma once

#include <cmath>
#include <optional>
#include <type_traits>

#include "dsl/layers.hpp"
#include "dsl/score_mods.hpp"

namespace qkv::dsl {

/// Option tag: mask out future keys (see causal_mask for the two alignments).
template <ir::CausalAlign Align> struct CausalTag {};
/// Option: causal attention aligned top-left, query i sees keys j <= i (a model's own sequence).
inline constexpr CausalTag<ir::CausalAlign::top_left> causal{};
/// Option: causal attention aligned bottom-right, query i sees keys j <= i + Lk - Lq (new queries
/// after cached keys: each sees every cached key and the new ones up to itself).
inline constexpr CausalTag<ir::CausalAlign::bottom_right> causal_bottom_right{};

/// Option: multiply the scores by this instead of 1/sqrt(d_k).
struct Scale {
  double value;  ///< The factor q kᵀ is multiplied by.
};
/// The option Scale{s}: q kᵀ is multiplied by s instead of 1/sqrt(D).
constexpr Scale scale(double s) { return {s}; }

/// Option: divide the (scaled) scores by a temperature; above 1 flattens the weights.
struct Temperature {
  double value;  ///< The temperature the scaled scores are divided by.
};
/// The option Temperature{t}: the scaled scores divided by t.
constexpr Temperature temperature(double t) { return {t}; }

/// Option: causal attention to the last W keys only (sliding-window attention, as Mistral's):
/// query i sees keys j with i + s - W < j <= i + s, s = Lk - Lq (bottom-right aligned, so a
/// query appended after cached keys sees the W keys before it).
template <std::int64_t W> struct SlidingWindow { static_assert(W > 0, "qkv: a sliding window holds at least one key"); };
/// Option: causal attention to the last W keys only (SlidingWindow<W> gives which keys).
template <std::int64_t W> inline constexpr SlidingWindow<W> sliding_window{};

/// Option: logit soft-capping of the scores before masking, cap * tanh(s / cap) (Gemma 2).
struct SoftCap {
  double cap;  ///< The cap: the scaled scores are mapped into (-cap, cap).
};
/// The option SoftCap{cap}: the scaled scores become cap * tanh(s / cap) (see softcap).
constexpr SoftCap softcap_scores(double cap) { return {cap}; }

/// Option: dropout on the attention weights with probability p (training only: pass p = 0, or
/// leave the option out, to evaluate), keyed by an i32 scalar seed input; see dropout().
template <Expr S> struct AttnDropout {
  S seed;    ///< The i32 scalar seed input (0 <= seed < 2^24) keying the mask.
  double p;  ///< The probability of dropping each weight; 0 draws no mask.
};
/// The option AttnDropout{seed, p}: dropout(weights, seed, p) after the softmax.
template <Expr S> constexpr AttnDropout<S> attn_dropout(double p, S seed) { return {seed, p}; }

/// Option: attention sinks (gpt-oss, StreamingLLM): a logit per head that joins each query's
/// softmax and gives no value (sink_softmax), so a query may weigh "nothing". `logits` is [H],
/// one per head (the scores' axis -3), or a float expression broadcasting to the scores'
/// [..., Lq, 1]; cast to the scores' dtype. Trained like any parameter; fused on every backend
/// with any other option.
template <Expr S> struct Sinks {
  S logits;  ///< The sink logits.
};
/// The option Sinks{s}: each row's softmax gets the sink logit s (per head when s is [H]).
template <Expr S> constexpr Sinks<S> sinks(S logits) { return {logits}; }

/// Option: a packed batch of sequences of different lengths, described by offsets rather than
/// padding (FlashAttention's cu_seqlens): q's rows [..., N, D] are the sequences' queries one
/// after another, sequence s's at rows [cu_q[s], cu_q[s + 1]), and k's and v's rows likewise at
/// [cu_k[s], cu_k[s + 1]) (offsets of their own: cross-attention, chunked prefill against a
/// cache). cu_q and cu_k are i32 [S + 1]: 0 first, N (M) last, nondecreasing (a sequence may be
/// empty). What it means is a document mask: a query keeps only its own sequence's keys; causality
/// and sliding windows apply within each sequence, aligned as the option says there
/// (causal_bottom_right and sliding_window: a sequence's queries come after its cached keys), and
/// score_mod and mask_mod get positions within the sequence as q_idx and kv_idx. Fused, tiles
/// that hold no pair of one sequence are skipped.
template <Expr CQ, Expr CK> struct Varlen {
  CQ cu_q;  ///< The queries' offsets, i32 [S + 1].
  CK cu_k;  ///< The keys' offsets, i32 [S + 1].
};
/// The option Varlen{cu_q, cu_k}: q's rows and k's rows as packed sequences (cross-attention).
template <Expr CQ, Expr CK> constexpr Varlen<CQ, CK> varlen(CQ cu_seqlens_q, CK cu_seqlens_k) {
  static_assert(CQ::dtype == DType::i32 && CQ::shape.rank == 1 && CK::dtype == DType::i32 && CK::shape.rank == 1,
                "qkv: varlen takes i32 offsets [S + 1] (cu_seqlens)");
  if constexpr (CQ::shape.rank == 1 && CK::shape.rank == 1)
    static_assert(ir::dims_compatible(CQ::shape[0], CK::shape[0]), "qkv: varlen's query and key offsets give the same number of sequences");
  return {cu_seqlens_q, cu_seqlens_k};
}
/// The option for self-attention over packed sequences: one set of offsets for q and k.
template <Expr C> constexpr auto varlen(C cu_seqlens) { return varlen(cu_seqlens, cu_seqlens); }

namespace detail {
template <class T> struct is_varlen : std::false_type {};
template <class CQ, class CK> struct is_varlen<Varlen<CQ, CK>> : std::true_type {};

/// Where rows at positions `pos` (f32 [..., R, 1]) fall among packed sequences with offsets `cu`
/// (i32 [S + 1]), each [..., R, 1]: the row's sequence, that sequence's first row and one past
/// its last (counts and extremes over the offsets).
template <Expr Pos, Expr Cu> constexpr auto sequence_of(Pos pos, Cu cu) { return sum<-1>(cast(cast(cu) <= pos)) - 1.0; }
template <Expr Pos, Expr Cu> constexpr auto sequence_start(Pos pos, Cu cu) { return max<-1>(where(cast(cu) <= pos, cast(cu), kNegInf)); }
template <Expr Pos, Expr Cu> constexpr auto sequence_end(Pos pos, Cu cu) { return -max<-1>(where(cast(cu) > pos, -cast(cu), kNegInf)); }

/// x [..., R, 1] reduced over every batch axis from Axis on: [1..., R, 1] (a grid for iota: its
/// values are never read; a reduction, unlike a slice, also takes a batch of none).
template <int Axis, Expr X> constexpr auto over_batch_axes(X x) {
  if constexpr (Axis >= X::shape.rank - 2) return x;
  else return over_batch_axes<Axis + 1>(max<Axis>(x));
}

/// Positions along the rows of x [..., R, D]: f32 [1..., R, 1], the same for every batch entry
/// (iota reads only its grid's shape: x's first column, once for all batch entries, where a
/// reduction over D read all of x and made every op on the positions once per batch entry).
template <Expr X> constexpr auto row_positions(X x) { return iota<X::shape.rank - 2>(over_batch_axes<0>(slice<-1, 0, 1>(x))); }

/// Score indices over packed sequences (varlen): b and h as Base's, q_idx and kv_idx positions
/// within the sequence, and what the sequence mask and per-sequence causality need.
template <class Base, class CQ, class CK> struct VarlenIndices {
  Base base;
  CQ cu_q;
  CK cu_k;
  static constexpr bool varlen = true;
  template <class X> static constexpr auto across(X x) { return transpose<-2, -1>(x); }  // [..., M, 1] -> [..., 1, M]
  constexpr auto b() const { return base.b(); }
  constexpr auto h() const { return base.h(); }
  // Positions from row_positions (the same for every batch entry), not from base's indices,
  // whose grids reduce over all of q and k.
  constexpr auto q_idx() const { return row_positions(base.q) - sequence_start(row_positions(base.q), cu_q); }
  constexpr auto kv_idx() const { return across(row_positions(base.k) - sequence_start(row_positions(base.k), cu_k)); }
  /// Whether query and key belong to one sequence.
  constexpr auto same_sequence() const { return sequence_of(row_positions(base.q), cu_q) == across(sequence_of(row_positions(base.k), cu_k)); }
  /// Positions from the sequence's end (bottom-right causality within it).
  constexpr auto q_from_end() const { return row_positions(base.q) - sequence_end(row_positions(base.q), cu_q); }
  constexpr auto kv_from_end() const { return across(row_positions(base.k) - sequence_end(row_positions(base.k), cu_k)); }
};

template <class Ix> constexpr auto with_varlen(const Ix& ix) { return ix; }
template <class Ix, class O, class... Rest> constexpr auto with_varlen(const Ix& ix, O o, Rest... rest) {
  if constexpr (is_varlen<O>::value) return VarlenIndices<Ix, decltype(o.cu_q), decltype(o.cu_k)>{ix, o.cu_q, o.cu_k};
  else return with_varlen(ix, rest...);
}
template <class Ix> constexpr bool is_varlen_indices() {
  if constexpr (requires { Ix::varlen; }) return Ix::varlen;
  else return false;
}

template <class T> struct is_sinks : std::false_type {};
template <class S> struct is_sinks<Sinks<S>> : std::true_type {};
template <class T> struct is_causal : std::false_type {};
template <ir::CausalAlign A> struct is_causal<CausalTag<A>> : std::true_type {};
template <std::int64_t W> struct is_causal<SlidingWindow<W>> : std::true_type {};
template <class T> struct is_dropout : std::false_type {};
template <class S> struct is_dropout<AttnDropout<S>> : std::true_type {};

template <class T> constexpr bool is_mask() {
  if constexpr (Expr<T>) return T::dtype == DType::boolean;
  else return false;
}
template <class T> constexpr bool is_bias() {
  if constexpr (Expr<T>) return is_float(T::dtype);
  else return false;
}

constexpr std::optional<double> scale_of(Scale s) { return s.value; }
template <class T> constexpr std::optional<double> scale_of(const T&) { return std::nullopt; }
constexpr double temperature_of(Temperature t) { return t.value; }
template <class T> constexpr double temperature_of(const T&) { return 1.0; }

template <ir::CausalAlign A> constexpr std::integral_constant<ir::CausalAlign, A> align_of(CausalTag<A>) { return {}; }
template <std::int64_t W> constexpr std::integral_constant<ir::CausalAlign, ir::CausalAlign::bottom_right> align_of(SlidingWindow<W>) { return {}; }
template <class T> constexpr std::int64_t window_of(T) { return 0; }
template <std::int64_t W> constexpr std::int64_t window_of(SlidingWindow<W>) { return W; }

/// Options apply in three passes, as FlexAttention applies score_mod before mask_mod: biases and
/// score_mods (in the order given), then boolean masks and mask_mods, then causality. A masked key stays masked whatever
/// its bias (even +inf or NaN), and the masks are the outermost ops, which fusion turns into the
/// kernel's block skipping.
enum class Pass { biases, masks, causality };

/// Causality (and a window) within each packed sequence: key j is kept for query i when
/// j - a_j <= i - a_i (a the sequence's first row, top-left; one past its last, bottom-right) and,
/// with a window W, j - a_j > i - a_i - W.
template <ir::CausalAlign A, std::int64_t W, class S, class Ix> constexpr auto causal_within_sequences(S scores, const Ix& ix) {
  auto q = [&] {
    if constexpr (A == ir::CausalAlign::top_left) return ix.q_idx();
    else return ix.q_from_end();
  }();
  auto k = [&] {
    if constexpr (A == ir::CausalAlign::top_left) return ix.kv_idx();
    else return ix.kv_from_end();
  }();
  // Positions are whole numbers (exact in f32): k <= q is q + 0.5 > k, one comparison where <=
  // is two, and the conditions nest rather than combine (the fused kernels evaluate them on
  // every score of a tile they cut).
  auto causal = where(q + 0.5 > k, scores, kNegInf);
  if constexpr (W == 0) return causal;
  else return where(k + static_cast<double>(W) > q, causal, kNegInf);
}

template <Pass P, class S, class Opt, class Ix> constexpr auto apply_option(S scores, Opt opt, const Ix& ix) {
  if constexpr (P == Pass::causality && is_causal<Opt>::value && is_varlen_indices<Ix>())
    return causal_within_sequences<decltype(align_of(opt))::value, window_of(Opt{})>(scores, ix);
  else if constexpr (P == Pass::causality && is_causal<Opt>::value)
    return where(causal_mask<decltype(align_of(opt))::value, window_of(Opt{})>(scores), scores, kNegInf);
  else if constexpr (P == Pass::masks && is_varlen<Opt>::value) return where(ix.same_sequence(), scores, kNegInf);
  else if constexpr (P == Pass::masks && is_mask<Opt>()) return where(opt, scores, kNegInf);
  else if constexpr (P == Pass::masks && is_mask_mod<Opt>::value) return apply_mask_mod(scores, opt, ix);
  else if constexpr (P == Pass::biases && is_bias<Opt>()) {
    // A bias in another float dtype (an f32 padding bias on f16 scores) is cast to the scores'
    // dtype, as PyTorch's SDPA wants its float mask in the query's dtype.
    if constexpr (Opt::dtype == S::dtype) return scores + opt;
    else return scores + cast<S::dtype>(opt);
  } else if constexpr (P == Pass::biases && is_score_mod<Opt>::value) return apply_score_mod(scores, opt, ix);
  else return scores;
}

template <Pass P, class S, class Ix> constexpr auto apply_pass(S scores, const Ix&) { return scores; }
template <Pass P, class S, class Ix, class O, class... Rest> constexpr auto apply_pass(S scores, const Ix& ix, O o, Rest... rest) {
  return apply_pass<P>(apply_option<P>(scores, o, ix), ix, rest...);
}

template <class S, class Ix, class... Opts> constexpr auto apply_options(S scores, const Ix& ix, Opts... opts) {
  return apply_pass<Pass::causality>(apply_pass<Pass::masks>(apply_pass<Pass::biases>(scores, ix, opts...), ix, opts...), ix, opts...);
}

/// Soft-capping comes first, before masks and biases.
template <class S> constexpr auto apply_softcap(S scores) { return scores; }
template <class S, class O, class... Rest> constexpr auto apply_softcap(S scores, O o, Rest... rest) {
  if constexpr (std::is_same_v<O, SoftCap>) return apply_softcap(softcap(scores, o.cap), rest...);
  else return apply_softcap(scores, rest...);
}

/// x in dtype DT: itself when it is.
template <DType DT, Expr X> constexpr auto as_dtype(X x) {
  if constexpr (X::dtype == DT) return x;
  else return cast<DT>(x);
}

/// The softmax over the keys, with the sinks where an option gives them.
template <class S> constexpr auto apply_softmax(S scores) { return softmax<-1>(scores); }
template <class S, class O, class... Rest> constexpr auto apply_softmax(S scores, O o, Rest... rest) {
  if constexpr (is_sinks<O>::value) {
    using L = decltype(o.logits);
    static_assert(is_float(L::dtype), "qkv: sinks(s) takes float logits");
    if constexpr (L::shape.rank == 1) {  // one per head: laid out along the scores' head axis
      static_assert(S::shape.rank >= 3, "qkv: sinks(s) with s [H] needs scores with a head axis, [..., H, Lq, Lk]");
      static_assert(ir::dims_compatible(L::shape[0], S::shape.back(2)), "qkv: sinks(s): s [H] needs H to be the scores' head count");
      constexpr ir::Shape per_head = [] {
        ir::Shape r;
        r.push_back(L::shape[0]);
        r.push_back(1);
        r.push_back(1);
        return r;
      }();
      return sink_softmax(scores, as_dtype<S::dtype>(reshape_to<per_head>(o.logits)));
    } else {
      return sink_softmax(scores, as_dtype<S::dtype>(o.logits));
    }
  } else {
    return apply_softmax(scores, rest...);
  }
}

/// Dropout on the weights, after the softmax.
template <class W> constexpr auto apply_dropout(W weights) { return weights; }
template <class W, class O, class... Rest> constexpr auto apply_dropout(W weights, O o, Rest... rest) {
  if constexpr (is_dropout<O>::value) return apply_dropout(dropout(weights, o.seed, o.p), rest...);
  else return apply_dropout(weights, rest...);
}
}  // namespace detail

/// softmax(q kᵀ · scale + masks) over the keys: the attention weights, shape [..., Lq, Lk].
/// q is [..., Lq, D], k is [..., Lk, D]; batch dims broadcast. Options, in any order: `causal` or
/// `causal_bottom_right`; a boolean mask expression broadcasting to [..., Lq, Lk] in which true
/// keeps a key (the scaled dot-product convention); a float expression broadcasting to the same,
/// added to the scores (an additive mask or bias: -inf or a large negative drops a key, and it is
/// differentiable; biases apply before the masks and causality, so a masked key stays masked); scale(x) (default 1/sqrt(D), for a named D resolved
/// when D is bound); temperature(t) (divides the scores by t after scaling); sliding_window<W> (causal, the last W keys); softcap_scores(c);
/// attn_dropout(p, seed) (dropout on the returned weights, as torch does; fused attention draws the
/// same bits inside its kernels, forward and backward); score_mod(f) and mask_mod(f) (a modifier
/// written as an expression of the score and its indices, dsl/score_mods.hpp); sinks(s) (a logit
/// per head joining each softmax, see Sinks); varlen(cu_q, cu_k) (packed sequences, see Varlen).
/// A query row whose keys
/// are all masked gets zero weights, so zero output and zero gradient, rather than NaN.
/// Masks: here true *keeps* a key (torch.nn.functional.scaled_dot_product_attention's
/// convention); torch.nn.MultiheadAttention's key_padding_mask is the opposite (true drops), see
/// key_padding_bias.
template <Expr Q, Expr K, class... Opts> constexpr auto attention_weights(Q q, K k, Opts... opts) {
  static_assert(
      ((detail::is_causal<Opts>::value || detail::is_mask<Opts>() || detail::is_bias<Opts>() || std::is_same_v<Opts, Scale> ||
        std::is_same_v<Opts, Temperature> || std::is_same_v<Opts, SoftCap> || detail::is_dropout<Opts>::value || detail::is_score_mod<Opts>::value ||
        detail::is_mask_mod<Opts>::value || detail::is_sinks<Opts>::value || detail::is_varlen<Opts>::value) &&
       ...),
      "qkv: attention options are causal, causal_bottom_right, sliding_window<W>, a boolean mask or float bias expression, "
      "scale(x), temperature(t), softcap_scores(c), attn_dropout(p, seed), score_mod(f), mask_mod(f), sinks(s) or varlen(cu)");
  static_assert((detail::is_causal<Opts>::value + ... + 0) <= 1, "qkv: give one of causal, causal_bottom_right, sliding_window<W>");
  static_assert((detail::is_sinks<Opts>::value + ... + 0) <= 1, "qkv: give sinks(s) once");
  static_assert((detail::is_varlen<Opts>::value + ... + 0) <= 1, "qkv: give varlen(cu) once");
  constexpr bool explicit_scale = (std::is_same_v<Opts, Scale> || ...);
  constexpr ir::Dim d = Q::shape.back(0);
  // The default scale of a named head dim is 1/sqrt(D) resolved when D is bound, so the graph
  // means the same at every size.
  Constant<> s{{}, 1.0, !explicit_scale && ir::is_symbol(d) ? d : ir::Dim{0}};
  if (!ir::is_symbol(d)) s.value = 1.0 / std::sqrt(static_cast<double>(d < 1 ? 1 : d));
  ((s.value = detail::scale_of(opts).value_or(s.value)), ...);
  ((s.value /= detail::temperature_of(opts)), ...);
  auto scores = detail::apply_softcap(matmul<false, true>(q, k) * s, opts...);
  const auto ix = detail::with_varlen(detail::ScoreIndices<Q, K>{q, k}, opts...);
  return detail::apply_dropout(detail::apply_softmax(detail::apply_options(scores, ix, opts...), opts...), opts...);
}

/// Scaled dot-product attention: attention_weights(q, k, opts...) @ v, shape [..., Lq, Dv].
/// Example:
/// \code
///   auto q = input<"q">(dim<"B">, dim<"N">, dim<64>);
///   auto k = input<"k">(dim<"B">, dim<"M">, dim<64>);
///   auto v = input<"v">(dim<"B">, dim<"M">, dim<64>);
///   auto out = scaled_dot_product_attention(q, k, v, causal);
/// \endcode
template <Expr Q, Expr K, Expr V, class... Opts> constexpr auto scaled_dot_product_attention(Q q, K k, V v, Opts... opts) {
  return matmul(attention_weights(q, k, opts...), v);
}

}  // namespace qkv::dsl
