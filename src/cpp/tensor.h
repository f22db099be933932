// What crosses from the bindings to the kernels: arrays as (pointer, dtype, shape,
// element strides), free of Python and nanobind, so that the kernel sources (compiled
// once per instruction set) stay plain C++.
#pragma once

#include <cstdint>

namespace vs {

enum class DType : int8_t { float16, bfloat16, float32, float64, uint8, int16, int32 };

// Kernel integers of the modes, equal to the aclnn interpolationMode / paddingMode codes
// and to volsample._tables' (Python) codes; the module exposes them as MODES and PADDINGS.
enum Mode : int { BILINEAR = 0, NEAREST = 1, BICUBIC = 2, BSPLINE = 3 };
enum Padding : int { ZEROS = 0, BORDER = 1, REFLECTION = 2 };

// An n-d array (n <= 5) of any strides, negative ones too: element (i0, ..., i{n-1}) lies
// at data + sum(i_k * stride[k]) elements. Volumes arrive in logical (N, C, D, H, W) axis
// order whatever their memory order (channels-last is a transposed view).
struct Strided {
  void* data = nullptr;
  DType dtype = DType::float32;
  int ndim = 0;
  int64_t shape[5] = {0, 0, 0, 0, 0};
  int64_t stride[5] = {0, 0, 0, 0, 0};

  template <class T>
  T* ptr() const { return static_cast<T*>(data); }
  bool empty() const { return data == nullptr; }
};

}  // namespace vs
