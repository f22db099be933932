// Why 2 threads beside a busy core can take as long as 1 on a call of a few milliseconds:
// the thread that shares its core runs in the scheduler's time slices, and where it is
// switched out while holding a piece of work, the call waits for its next slice. This
// program runs 64 equal pieces of arithmetic (about 8 ms on one thread) on 2 OpenMP
// threads, taken dynamically, and prints when each thread started its pieces and finished.
//
//   g++ -O2 -fopenmp -o /tmp/held_piece benchmarks/held_piece.cpp
//   taskset -c 1 python3 -c "while 1: pass" &        # keep CPU 1 busy
//   OMP_PROC_BIND=true OMP_PLACES=cores /tmp/held_piece   # thread 0 on CPU 0, 1 on CPU 1
//   kill %1
//
// Measured on a 2-core AMD EPYC (Zen 4) VM, Linux 6.18 (HZ=250), 2026-12-05: in four runs
// of five every piece was taken by 4.3 ms, and the call ended at 8.0 ms, when the thread
// beside the busy loop got its next 4 ms slice and finished the piece it held. Unpinned,
// both threads often ran on CPU 0 in turns (16 ms): what src/cpp/team.h prevents.
#include <omp.h>
#include <time.h>

#include <cstdio>

namespace {

volatile double sink;

double piece() {  // about 0.125 ms of dependent arithmetic
  double s = 0;
  for (int i = 0; i < 100000; ++i) s += (i * 0.5) / (i + 1.0);
  return s;
}

double now_ms() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

}  // namespace

int main() {
  constexpr int kPieces = 64;
  for (int run = 0; run < 5; ++run) {
    double start[kPieces];
    int taker[kPieces];
    double finished[2] = {0, 0};
    const double t0 = now_ms();
#pragma omp parallel num_threads(2)
    {
      const int t = omp_get_thread_num();
      double s = 0;
#pragma omp for schedule(dynamic, 1) nowait
      for (int p = 0; p < kPieces; ++p) {
        start[p] = now_ms() - t0;
        taker[p] = t;
        s += piece();
      }
      finished[t] = now_ms() - t0;
      sink = s;
    }
    std::printf("call %.2f ms; thread 0 finished at %.2f, thread 1 at %.2f; last piece taken "
                "at %.2f by thread %d\n", now_ms() - t0, finished[0], finished[1],
                start[kPieces - 1], taker[kPieces - 1]);
  }
}
