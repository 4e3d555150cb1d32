#include "core/threadpool.h"

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#define EMBER_PAUSE() _mm_pause()
#else
#define EMBER_PAUSE() ((void)0)
#endif

namespace ember {

namespace {
// About a millisecond of spinning before an idle worker goes to sleep.
constexpr int kSpinIterations = 1 << 15;
// Inside a task, waiters spin this long before yielding their core: on a loaded machine the
// thread being waited for may need it.
constexpr int kSpinBeforeYield = 1 << 10;

template <typename Done>
void wait_until(Done done) {
  for (int spin = 0; !done(); ++spin) {
    if (spin < kSpinBeforeYield) {
      EMBER_PAUSE();
    } else {
      std::this_thread::yield();
    }
  }
}
}  // namespace

ThreadPool::ThreadPool(int n_threads) : n_threads_(n_threads < 1 ? 1 : n_threads) {
  workers_.reserve(n_threads_ - 1);
  for (int i = 1; i < n_threads_; ++i) workers_.emplace_back([this, i] { worker_loop(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_.store(true);
    generation_.fetch_add(1);
  }
  wake_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::run(TaskFn fn, void* arg) {
  if (n_threads_ == 1) {
    fn(arg, 0, 1);
    return;
  }
  task_ = fn;
  task_arg_ = arg;
  n_done_.store(0, std::memory_order_relaxed);
  {
    // Publishing under the mutex means a worker about to sleep cannot miss the new generation.
    std::lock_guard<std::mutex> lock(mutex_);
    generation_.fetch_add(1, std::memory_order_release);
  }
  if (n_sleeping_.load(std::memory_order_acquire) > 0) wake_.notify_all();
  fn(arg, 0, n_threads_);
  wait_until([&] { return n_done_.load(std::memory_order_acquire) >= n_threads_ - 1; });
}

void ThreadPool::worker_loop(int ith) {
  uint64_t seen = 0;
  for (;;) {
    uint64_t gen = generation_.load(std::memory_order_acquire);
    for (int spin = 0; gen == seen && spin < kSpinIterations; ++spin) {
      EMBER_PAUSE();
      gen = generation_.load(std::memory_order_acquire);
    }
    if (gen == seen) {
      std::unique_lock<std::mutex> lock(mutex_);
      n_sleeping_.fetch_add(1);
      wake_.wait(lock, [&] { return generation_.load(std::memory_order_acquire) != seen; });
      n_sleeping_.fetch_sub(1);
      gen = generation_.load(std::memory_order_acquire);
    }
    seen = gen;
    if (stop_.load()) return;
    task_(task_arg_, ith, n_threads_);
    n_done_.fetch_add(1, std::memory_order_acq_rel);
  }
}

void ThreadPool::barrier() {
  if (n_threads_ == 1) return;
  const uint32_t phase = barrier_phase_.load(std::memory_order_acquire);
  if (barrier_count_.fetch_add(1, std::memory_order_acq_rel) == n_threads_ - 1) {
    barrier_count_.store(0, std::memory_order_relaxed);
    barrier_phase_.fetch_add(1, std::memory_order_acq_rel);
    return;
  }
  wait_until([&] { return barrier_phase_.load(std::memory_order_acquire) != phase; });
}

}  // namespace ember
