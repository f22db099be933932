// What the per-family binding files share (compiled into the module only, never into the
// per-ISA kernel objects).
#pragma once

#include <nanobind/nanobind.h>

#include <cstdint>

#include "kernels.h"

namespace vs {

// A kernel operand: an ndarray's memory as a Strided view; None gives an absent operand.
Strided strided(const nanobind::handle& obj);

// Where an ndarray's memory starts (0 for None): the address a prepared call's run on
// arrays (`forward_on`, `backward_on`) places its operand on.
inline uintptr_t address(const nanobind::handle& obj) {
  return reinterpret_cast<uintptr_t>(strided(obj).data);
}

// A prepared operand (shape, strides, dtype) placed on the memory at `address`; an absent
// one stays absent.
inline void place(Strided& s, uintptr_t address) {
  if (!s.empty()) s.data = reinterpret_cast<void*>(address);
}

}  // namespace vs
