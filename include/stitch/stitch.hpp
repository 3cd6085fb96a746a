// stitch/stitch.hpp — the whole C++ API in one include.
#pragma once

#include "stitch/allocator.hpp"
#include "stitch/backend.hpp"
#include "stitch/config.hpp"
#include "stitch/errors.hpp"
#include "stitch/kv_pool.hpp"
#include "stitch/sim_backend.hpp"
#include "stitch/stats.hpp"
