// Whole blocks: the pre-norm decoder block (torch's TransformerEncoderLayer(norm_first=True) with a
// causal mask) and the encoder-decoder block (TransformerDecoderLayer(norm_first=True)), with a
// feed-forward width of 4 x embed.
#include "dsl/dsl.hpp"
#include "models/builders.hpp"

namespace qkv::models {

namespace {
template <bool Cross> ir::Graph build_block(const Options& o) {
  const std::string& act = o.text("activation");
  if (act != "relu" && act != "gelu") throw UsageError("activation must be relu or gelu, got '" + act + "'");
  constexpr DimArg E = "E", H = "H";
  auto x = input<"x">(dim<"B">, dim<"N">, dim<E>);
  auto block = [&]<Activation A>() {
    if constexpr (Cross) return lower(named<"out">(encoder_decoder_block<"", E, H, 4 * E, A>(x, input<"memory">(dim<"B">, dim<"M">, dim<E>))));
    else return lower(named<"out">(decoder_block<"", E, H, 4 * E, A>(x)));
  };
  return with_sizes(act == "gelu" ? block.template operator()<Activation::gelu>() : block.template operator()<Activation::relu>(), o);
}
}  // namespace

ir::Graph build_decoder_block(const Options& o, const Dims&) { return build_block<false>(o); }
ir::Graph build_encoder_decoder_block(const Options& o, const Dims&) { return build_block<true>(o); }

}  // namespace qkv::models
