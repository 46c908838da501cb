// qkv's IR: graphs of ops with symbolic dims, their text form, shape binding, the passes and
// reverse-mode autodiff. `#include <qkv/ir.hpp>`.
#pragma once

#include "ir/bind.hpp"
#include "ir/error.hpp"
#include "ir/graph.hpp"
#include "ir/passes/passes.hpp"
#include "ir/printer.hpp"
#include "ir/tensor.hpp"
#include "ir/verifier.hpp"
