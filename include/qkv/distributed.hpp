// Jobs of several processes under mpirun: the communicator and ring attention.
// `#include <qkv/distributed.hpp>`.
#pragma once

#include "distributed/communicator.hpp"
#include "distributed/ring_attention.hpp"
