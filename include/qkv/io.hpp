// Reading and writing tensors: NumPy .npy and safetensors. `#include <qkv/io.hpp>`.
#pragma once

#include "io/npy.hpp"
#include "io/safetensors.hpp"
