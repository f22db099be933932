// TeamCpus (team.h) on Linux's sched_getcpu and thread affinity; elsewhere it does nothing.
#include "team.h"

#include <algorithm>

#if defined(__linux__)
#include <pthread.h>
#include <sched.h>
#endif

namespace vs {

TeamCpus::TeamCpus(int threads) : count_(std::min(threads, kTracked)) {
#if defined(__linux__)
  if (count_ < 2) return;
  cpus_[0].store(sched_getcpu(), std::memory_order_relaxed);
  for (int t = 1; t < count_; ++t) cpus_[t].store(-1, std::memory_order_relaxed);
#endif
}

void TeamCpus::settle(int thread) {
#if defined(__linux__)
  if (thread <= 0 || thread >= count_) return;
  const int cpu = sched_getcpu();
  cpus_[thread].store(cpu);
  // Thread 0's CPU is known before the region; the other threads' as they arrive, so two
  // woken on one CPU are seen by at least the later of them.
  bool shared = false;
  for (int t = 0; t < count_; ++t) shared |= t != thread && cpus_[t].load() == cpu;
  if (cpu < 0 || !shared) return;
  cpu_set_t allowed, away;
  if (pthread_getaffinity_np(pthread_self(), sizeof allowed, &allowed) != 0) return;
  away = allowed;
  for (int t = 0; t < count_; ++t) {
    const int c = cpus_[t].load();
    if (c >= 0 && c < CPU_SETSIZE) CPU_CLR(c, &away);
  }
  if (CPU_COUNT(&away) == 0) return;
  // Setting a mask without the thread's CPU moves it at once; the mask given back keeps
  // it where it went.
  if (pthread_setaffinity_np(pthread_self(), sizeof away, &away) != 0) return;
  pthread_setaffinity_np(pthread_self(), sizeof allowed, &allowed);
  cpus_[thread].store(sched_getcpu());
#else
  (void)thread;
#endif
}

int current_cpu() {
#if defined(__linux__)
  return sched_getcpu();
#else
  return -1;
#endif
}

}  // namespace vs
