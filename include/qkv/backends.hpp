// qkv's backends, chosen by name at run time ("reference", "cpu", "vulkan"), and the check of one
// against another. `#include <qkv/backends.hpp>`.
#pragma once

#include "backends/backend.hpp"
#include "backends/equivalence.hpp"
