// The memory bandwidth of this machine, as benchmarks/backward_account.py reports it: each
// function runs one pass over n bytes on `threads` OpenMP threads (static halves, so each
// thread touches the same part of every buffer) and returns its wall time in seconds.
// Buffers are mapped by `map_buffer` on 2 MiB pages where the kernel allows (the pages
// NumPy asks for on arrays of 4 MiB and more), so a first touch takes a fault per 2 MiB.
//
//   g++ -O3 -march=native -fopenmp -shared -fPIC -o /tmp/bandwidth.so benchmarks/bandwidth.cpp
//
// (backward_account.py builds it so and loads it with ctypes.)
#include <omp.h>
#include <sys/mman.h>

#include <cstddef>
#include <cstdint>

namespace {

using Word = std::uint64_t;

}  // namespace

extern "C" {

// n bytes of anonymous memory, not touched yet; nullptr where mmap fails.
void* map_buffer(std::size_t n) {
  void* p = mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return nullptr;
#ifdef MADV_HUGEPAGE
  madvise(p, n, MADV_HUGEPAGE);
#endif
  return p;
}

void unmap_buffer(void* p, std::size_t n) { munmap(p, n); }

// Stores over n bytes (memory mapped or not: the first pass over new memory is the first
// touch, which the operating system zeroes page by page before the stores land).
double write_pass(void* buffer, std::size_t n, Word value, int threads) {
  Word* words = static_cast<Word*>(buffer);
  const std::int64_t count = static_cast<std::int64_t>(n / sizeof(Word));
  const double start = omp_get_wtime();
#pragma omp parallel for schedule(static) num_threads(threads)
  for (std::int64_t i = 0; i < count; ++i) words[i] = value + static_cast<Word>(i);
  return omp_get_wtime() - start;
}

// Loads over n bytes, summed (into *sum, so that the loads are not dropped).
double read_pass(const void* buffer, std::size_t n, Word* sum, int threads) {
  const Word* words = static_cast<const Word*>(buffer);
  const std::int64_t count = static_cast<std::int64_t>(n / sizeof(Word));
  Word total = 0;
  const double start = omp_get_wtime();
#pragma omp parallel for schedule(static) num_threads(threads) reduction(+ : total)
  for (std::int64_t i = 0; i < count; ++i) total += words[i];
  const double seconds = omp_get_wtime() - start;
  *sum = total;
  return seconds;
}

// n bytes copied from source to target (both mapped before).
double copy_pass(void* target, const void* source, std::size_t n, int threads) {
  Word* to = static_cast<Word*>(target);
  const Word* from = static_cast<const Word*>(source);
  const std::int64_t count = static_cast<std::int64_t>(n / sizeof(Word));
  const double start = omp_get_wtime();
#pragma omp parallel for schedule(static) num_threads(threads)
  for (std::int64_t i = 0; i < count; ++i) to[i] = from[i];
  return omp_get_wtime() - start;
}

}  // extern "C"
