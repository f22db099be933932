// What the per-family binding files share (compiled into the module only, never into the
// per-ISA kernel objects).
#pragma once

#include <nanobind/nanobind.h>

#include "kernels.h"

namespace vs {

// A kernel operand: an ndarray's memory as a Strided view; None gives an absent operand.
Strided strided(const nanobind::handle& obj);

}  // namespace vs
