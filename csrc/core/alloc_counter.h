// Counts heap allocations made by ember's own code while a graph runs, so tests can check that
// a run allocates nothing. The module replaces operator new (visible to its own code only).
#pragma once
#include <atomic>
#include <cstdint>

namespace ember {

extern std::atomic<int> g_runs_active;
extern std::atomic<uint64_t> g_allocations_during_run;

struct AllocationWatch {
  AllocationWatch() { g_runs_active.fetch_add(1); }
  ~AllocationWatch() { g_runs_active.fetch_sub(1); }
};

inline uint64_t allocations_during_run() { return g_allocations_during_run.load(); }

}  // namespace ember
