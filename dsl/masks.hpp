// Masks from data: padding masks from token ids in both conventions users meet.
#pragma once

#include "dsl/ops.hpp"

namespace qkv::dsl {

/// The scaled-dot-product keep-mask for token ids [B, M] padded with `pad_id`: bool [B, 1, 1, M],
/// true for real tokens (kept), broadcasting over heads and queries of scores [B, H, N, M].
/// \code
///   auto ids = input<"ids", DType::i32>(dim<"B">, dim<"M">);
///   auto keep = padding_mask(ids, 0);  // pass as a mask option to attention
/// \endcode
template <Expr Ids>
constexpr auto padding_mask(Ids ids, std::int32_t pad_id) {
  static_assert(Ids::dtype == DType::i32 && Ids::shape.rank == 2, "qkv: padding_mask takes i32 ids [batch, keys]");
  constexpr ir::Shape s{Ids::shape[0], 1, 1, Ids::shape[1]};
  return detail::reshape_to<s>(greater(maximum(cast(ids) - static_cast<double>(pad_id), -(cast(ids) - static_cast<double>(pad_id))), 0.5));
}

/// torch.nn.MultiheadAttention's key_padding_mask for the same ids: bool [B, M], true where the
/// key is padding (ignored): the opposite of padding_mask's convention.
template <Expr Ids>
constexpr auto key_padding_mask(Ids ids, std::int32_t pad_id) {
  static_assert(Ids::dtype == DType::i32 && Ids::shape.rank == 2, "qkv: key_padding_mask takes i32 ids [batch, keys]");
  return equal(cast(ids), static_cast<double>(pad_id));
}

}  // namespace qkv::dsl
