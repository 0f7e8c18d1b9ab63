#include "strata/core/thread_pool.h"

#include <algorithm>

namespace strata {

ThreadPool::ThreadPool(int threads) {
  if (threads <= 0) threads = int(std::max(1u, std::thread::hardware_concurrency()));
  for (int i = 1; i < threads; ++i) workers_.emplace_back([this] { worker_loop(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  work_cv_.notify_all();
  for (auto& w : workers_) w.join();
}

void ThreadPool::parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  if (workers_.empty() || n == 1) {
    fn(0, n);
    return;
  }
  std::unique_lock<std::mutex> lock(mu_);
  job_ = &fn;
  job_n_ = n;
  // A few chunks per thread balance uneven work without much queueing overhead.
  chunks_ = std::min<int64_t>(n, int64_t(size()) * 4);
  chunk_size_ = (n + chunks_ - 1) / chunks_;
  chunks_ = (n + chunk_size_ - 1) / chunk_size_;
  next_chunk_ = 0;
  chunks_done_ = 0;
  error_ = nullptr;
  ++generation_;
  work_cv_.notify_all();
  while (next_chunk_ < chunks_) {
    int64_t c = next_chunk_++;
    lock.unlock();
    try {
      fn(c * chunk_size_, std::min(n, (c + 1) * chunk_size_));
    } catch (...) {
      std::lock_guard<std::mutex> g(mu_);
      if (!error_) error_ = std::current_exception();
    }
    lock.lock();
    ++chunks_done_;
  }
  done_cv_.wait(lock, [&] { return chunks_done_ == chunks_; });
  job_ = nullptr;
  if (error_) std::rethrow_exception(error_);
}

void ThreadPool::worker_loop() {
  uint64_t seen = 0;
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    work_cv_.wait(lock, [&] { return stop_ || (generation_ != seen && job_ && next_chunk_ < chunks_); });
    if (stop_) return;
    while (job_ && next_chunk_ < chunks_) {
      int64_t c = next_chunk_++;
      const auto* fn = job_;
      int64_t n = job_n_, cs = chunk_size_;
      lock.unlock();
      try {
        (*fn)(c * cs, std::min(n, (c + 1) * cs));
      } catch (...) {
        std::lock_guard<std::mutex> g(mu_);
        if (!error_) error_ = std::current_exception();
      }
      lock.lock();
      if (++chunks_done_ == chunks_) done_cv_.notify_all();
    }
    seen = generation_;
  }
}

}  // namespace strata
