// The torch.nn layers the architectures are made of, as reflected modules (models/module.hpp):
// their members named as PyTorch names their parameters.
#pragma once

#include <optional>

#include "models/module.hpp"

namespace qkv::models {

/// nn.Linear: weight [out, in], bias [out] when built with one.
struct Linear {
  BOOST_HANA_DEFINE_STRUCT(Linear, (Parameter, weight), (std::optional<Parameter>, bias));
};
/// nn.LayerNorm: weight and bias [E].
struct LayerNorm {
  BOOST_HANA_DEFINE_STRUCT(LayerNorm, (Parameter, weight), (Parameter, bias));
};
/// RMSNorm (Llama's): weight [E].
struct RmsNorm {
  BOOST_HANA_DEFINE_STRUCT(RmsNorm, (Parameter, weight));
};
/// nn.Embedding: weight [rows, E].
struct Embedding {
  BOOST_HANA_DEFINE_STRUCT(Embedding, (Parameter, weight));
};
/// An untied LM head: lm_head.weight [V, E] (nn.Linear without bias).
struct LmHead {
  BOOST_HANA_DEFINE_STRUCT(LmHead, (Parameter, weight));
};

}  // namespace qkv::models
