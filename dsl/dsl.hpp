// The qkv DSL: include this to write attention as expressions and lower them to ir::Graph.
#pragma once

#include "dsl/analysis.hpp"
#include "dsl/attention.hpp"
#include "dsl/blocks.hpp"
#include "dsl/dims.hpp"
#include "dsl/expr.hpp"
#include "dsl/grad.hpp"
#include "dsl/kv_cache.hpp"
#include "dsl/layers.hpp"
#include "dsl/losses.hpp"
#include "dsl/lower.hpp"
#include "dsl/masks.hpp"
#include "dsl/multi_head.hpp"
#include "dsl/ops.hpp"
#include "dsl/positions.hpp"

namespace qkv {
using namespace dsl;  // the DSL's names are qkv's names: qkv::input, qkv::lower, ...
}  // namespace qkv
