// Stands in for <omp.h> in a build without OpenMP (CMakeLists.txt puts this folder on the
// include path only then): the calls the kernels make, answered for a team of one thread.
// The `#pragma omp` lines are then ignored, so every parallel loop runs whole on the
// calling thread, in the order a one-thread team would run it.
#pragma once

inline int omp_get_max_threads() { return 1; }
inline int omp_get_num_threads() { return 1; }
inline int omp_get_thread_num() { return 0; }
inline void omp_set_num_threads(int) {}
