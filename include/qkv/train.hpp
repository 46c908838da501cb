// Training on a backend: initialisers, optimizers as graph updates, the trainer.
// `#include <qkv/train.hpp>`.
#pragma once

#include "train/init.hpp"
#include "train/optimizer.hpp"
#include "train/trainer.hpp"
