// Jobs of several processes under mpirun: the communicator and ring attention.
// `#include <qkv/dist.hpp>`.
#pragma once

#include "dist/communicator.hpp"
#include "dist/ring_attention.hpp"
