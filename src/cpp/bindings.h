// What the per-family binding files share (compiled into the module only, never into the
// per-ISA kernel objects).
#pragma once

#include <nanobind/nanobind.h>

#include <cstdint>

#include "kernels.h"

namespace vs {

// A kernel operand: an ndarray's memory as a Strided view; None gives an absent operand.
Strided strided(const nanobind::handle& obj);

// A prepared operand (shape, strides, dtype) placed on the memory at `address`; an absent
// one stays absent.
inline void place(Strided& s, uintptr_t address) {
  if (!s.empty()) s.data = reinterpret_cast<void*>(address);
}

}  // namespace vs
