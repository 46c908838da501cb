// All of qkv's public API: the IR, the DSL, the backends, io and training. `#include <qkv/qkv.hpp>`.
#pragma once

#include "backends.hpp"
#include "dsl.hpp"
#include "io.hpp"
#include "ir.hpp"
#include "train.hpp"
