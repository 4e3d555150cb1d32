#include "core/alloc_counter.h"

#include <cstdlib>
#include <new>

namespace ember {
std::atomic<int> g_runs_active{0};
std::atomic<uint64_t> g_allocations_during_run{0};
}  // namespace ember

namespace {
void* counted_alloc(std::size_t size) {
  if (ember::g_runs_active.load(std::memory_order_relaxed) > 0)
    ember::g_allocations_during_run.fetch_add(1, std::memory_order_relaxed);
  void* p = std::malloc(size ? size : 1);
  if (!p) throw std::bad_alloc();
  return p;
}
}  // namespace

// The module is built with hidden visibility, so these replace operator new for ember's code only.
void* operator new(std::size_t size) { return counted_alloc(size); }
void* operator new[](std::size_t size) { return counted_alloc(size); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
