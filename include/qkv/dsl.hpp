// qkv's DSL: attention written as expressions whose shapes the compiler checks, lowered to the
// IR with lower(...). `#include <qkv/dsl.hpp>`.
#pragma once

#include "dsl/dsl.hpp"
#include "ir/printer.hpp"
