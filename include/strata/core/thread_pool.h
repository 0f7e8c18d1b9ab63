// A fixed pool of worker threads for data-parallel loops on the CPU backend.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace strata {

class ThreadPool {
public:
  explicit ThreadPool(int threads);  // threads <= 0: hardware concurrency
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return int(workers_.size()) + 1; }
  // Calls fn(begin, end) over chunks of [0, n) on the pool and the calling thread; returns when
  // all chunks are done. The first exception thrown by fn is rethrown here.
  void parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn);

private:
  void worker_loop();
  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable work_cv_, done_cv_;
  const std::function<void(int64_t, int64_t)>* job_ = nullptr;
  int64_t job_n_ = 0, next_chunk_ = 0, chunks_ = 0, chunks_done_ = 0, chunk_size_ = 1;
  uint64_t generation_ = 0;
  bool stop_ = false;
  std::exception_ptr error_;
};

// fn(begin, end) over [0, n): on `pool` where there is one, else in one call on this thread.
inline void parallel_for(ThreadPool* pool, int64_t n, const std::function<void(int64_t, int64_t)>& fn) {
  if (pool) pool->parallel_for(n, fn);
  else if (n > 0) fn(0, n);
}

}  // namespace strata
