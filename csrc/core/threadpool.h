// A persistent pool of worker threads. run() hands every worker (and the calling thread, as
// worker 0) the same task; inside a task, barrier() synchronizes all of them. Workers spin
// briefly between tasks (decode steps come back to back) and then sleep.
#pragma once
#include <atomic>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

namespace ember {

class ThreadPool {
 public:
  using TaskFn = void (*)(void* arg, int ith, int nth);

  explicit ThreadPool(int n_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return n_threads_; }
  // Runs fn(arg, ith, n_threads) on every thread; returns when all are done.
  void run(TaskFn fn, void* arg);
  // Called by all n_threads participants of the current task.
  void barrier();

 private:
  void worker_loop(int ith);

  const int n_threads_;
  std::vector<std::thread> workers_;
  TaskFn task_ = nullptr;
  void* task_arg_ = nullptr;
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> n_done_{0};
  std::atomic<bool> stop_{false};
  std::atomic<int> n_sleeping_{0};
  std::mutex mutex_;
  std::condition_variable wake_;
  // Sense-reversing barrier.
  alignas(64) std::atomic<int> barrier_count_{0};
  alignas(64) std::atomic<uint32_t> barrier_phase_{0};
};

}  // namespace ember
