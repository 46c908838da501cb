// Masks from data: padding masks from token ids in both conventions users meet, and document
// masks for packed sequences.
#pragma once

#include "dsl/ops.hpp"

namespace qkv::dsl {

/// The scaled-dot-product keep-mask for token ids [B, M] padded with `pad_id`: bool [B, 1, 1, M],
/// true for real tokens (kept), broadcasting over heads and queries of scores [B, H, N, M].
/// \code
///   auto ids = input<"ids", DType::i32>(dim<"B">, dim<"M">);
///   auto keep = padding_mask(ids, 0);  // pass as a mask option to attention
/// \endcode
template <Expr Ids> constexpr auto padding_mask(Ids ids, std::int32_t pad_id) {
  static_assert(Ids::dtype == DType::i32 && Ids::shape.rank == 2, "qkv: padding_mask takes i32 ids [batch, keys]");
  constexpr ir::Shape s{Ids::shape[0], 1, 1, Ids::shape[1]};
  return detail::reshape_to<s>(greater(maximum(cast(ids) - static_cast<double>(pad_id), -(cast(ids) - static_cast<double>(pad_id))), 0.5));
}

/// torch.nn.MultiheadAttention's key_padding_mask for the same ids: bool [B, M], true where the
/// key is padding (ignored): the opposite of padding_mask's convention.
template <Expr Ids> constexpr auto key_padding_mask(Ids ids, std::int32_t pad_id) {
  static_assert(Ids::dtype == DType::i32 && Ids::shape.rank == 2, "qkv: key_padding_mask takes i32 ids [batch, keys]");
  return equal(cast(ids), static_cast<double>(pad_id));
}

/// Document masking for packed sequences: query i keeps key j when both belong to the same
/// document. `q_docs` [B, N] and `kv_docs` [B, M] are i32 document ids; the result is a bool
/// keep-mask [B, 1, N, M] for scores [B, H, N, M]. Passed as a mask option, attention's fusion
/// recomputes it per tile from the ids (nothing N x M is kept).
/// \code
///   auto x = input<"x">(dim<"B">, dim<4>, dim<"N">, dim<16>);
///   auto docs = input<"docs", DType::i32>(dim<"B">, dim<"N">);
///   auto out = scaled_dot_product_attention(x, x, x, document_mask(docs, docs), causal);
/// \endcode
template <Expr QDocs, Expr KvDocs> constexpr auto document_mask(QDocs q_docs, KvDocs kv_docs) {
  static_assert(QDocs::dtype == DType::i32 && QDocs::shape.rank == 2 && KvDocs::dtype == DType::i32 && KvDocs::shape.rank == 2,
                "qkv: document_mask takes i32 ids [batch, queries] and [batch, keys]");
  constexpr ir::Shape qs{QDocs::shape[0], 1, QDocs::shape[1], 1}, ks{KvDocs::shape[0], 1, 1, KvDocs::shape[1]};
  return equal(detail::reshape_to<qs>(cast(q_docs)), detail::reshape_to<ks>(cast(kv_docs)));
}

}  // namespace qkv::dsl
