// All of qkv's public API: the IR, the DSL, the backends, io, training and distributed jobs. `#include <qkv/qkv.hpp>`.
#pragma once

#include "backends.hpp"
#include "distributed.hpp"
#include "dsl.hpp"
#include "io.hpp"
#include "ir.hpp"
#include "train.hpp"
