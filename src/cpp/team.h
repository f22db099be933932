// A parallel region's threads on distinct CPUs.
//
// Threads that wait for work sleep (OMP_WAIT_POLICY=passive: volsample/_cpu/__init__.py),
// so each region wakes its team, and Linux tends to wake a thread on the CPU of the thread
// that wakes it when no CPU is idle. With one core busy in another process, a 2-thread
// region then often runs both threads on the caller's CPU, and the load balancer leaves
// them there: moving one beside the busy process looks no better to it. The region then
// takes a thread's time or more (measured: benchmarks/busy_core.py, docs/performance.md).
// TeamCpus moves a woken thread that finds a team-mate on its CPU to a CPU of its affinity
// mask that none of the team is on, then gives the mask back: the thread's mask is
// unchanged, only where it runs. Elsewhere than Linux, and where no such CPU is allowed,
// it does nothing.
#pragma once

#include <atomic>

namespace vs {

class TeamCpus {
 public:
  // Made by the calling thread just before the region, which it runs as thread 0.
  explicit TeamCpus(int threads);
  // Called by every thread first thing in the region.
  void settle(int thread);

 private:
  static constexpr int kTracked = 64;  // threads beyond stay where they are woken
  int count_;
  std::atomic<int> cpus_[kTracked];  // each thread's CPU, -1 until it says
};

// The CPU the calling thread runs on, or -1 where that is not known.
int current_cpu();

}  // namespace vs
