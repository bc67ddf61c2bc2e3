// The threads of a lone rank's host ops: host::set_threads(n) gives the process n - 1 helper threads,
// and host::parallel(parts, f) runs f(p) for every part p in [0, parts), part p on thread p % n
// (the caller is thread 0), returning when all are done.
//
// For a process that runs one rank (weft-train with data, tensor and pipe 1; train_step
// --threads): the GEMMs and the heavy elementwise and row ops split their work into parts whose
// results do not depend on how many threads run them (the ops, ops/*.hpp), so a
// run on n cores gives the same bits as a run on one. Thread ranks keep 1: when the helpers are
// busy (another rank's op holds them) or the call comes from inside a part, parallel() runs the
// parts on the calling thread, in order.
//
// The helpers wait for work spinning (yielding) for about 50 us, then sleep on a condition
// variable: the ops of one step come back to back, and a sleeping thread takes tens of
// microseconds to wake.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "weft/core/error.hpp"

namespace weft::host {

class Workers {
 public:
  // threads >= 1: the caller plus threads - 1 helpers.
  explicit Workers(int threads) : threads_(threads) {
    if (threads < 1 || threads > 1024)
      throw Error("host::Workers", cat("threads ", threads), "give between 1 and 1024 threads");
    for (int t = 1; t < threads; ++t) helpers_.emplace_back([this, t] { serve(t); });
  }
  Workers(const Workers&) = delete;
  Workers& operator=(const Workers&) = delete;
  ~Workers() {
    {
      const std::lock_guard lock(mu_);
      stop_ = true;
      ++generation_;
    }
    wake_.notify_all();
    for (std::thread& h : helpers_) h.join();
  }

  int threads() const { return threads_; }

  // f(p) for p in [0, parts): on the helpers when they are free, else here in order. The first
  // exception a part throws is rethrown here once all parts have ended.
  template <class F>
  void run(std::int64_t parts, F&& f) {
    if (parts <= 0) return;
    std::unique_lock busy(run_mu_, std::try_to_lock);
    if (threads_ == 1 || parts == 1 || inside() || !busy.owns_lock()) {
      for (std::int64_t p = 0; p < parts; ++p) f(p);
      return;
    }
    auto call = [](void* fn, std::int64_t p) { (*static_cast<std::remove_reference_t<F>*>(fn))(p); };
    {
      const std::lock_guard lock(mu_);
      job_ = {call, static_cast<void*>(&f), parts};
      error_ = nullptr;
      pending_.store(threads_ - 1, std::memory_order_relaxed);
      generation_.fetch_add(1, std::memory_order_release);
    }
    wake_.notify_all();
    work(0);
    // Wait for the helpers: spin briefly, then sleep.
    const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(50);
    while (pending_.load(std::memory_order_acquire) != 0 && std::chrono::steady_clock::now() < until)
      std::this_thread::yield();
    if (pending_.load(std::memory_order_acquire) != 0) {
      std::unique_lock lock(mu_);
      done_.wait(lock, [&] { return pending_.load(std::memory_order_acquire) == 0; });
    }
    if (error_) std::rethrow_exception(error_);
  }

 private:
  struct Job {
    void (*call)(void*, std::int64_t) = nullptr;
    void* fn = nullptr;
    std::int64_t parts = 0;
  };

  static bool& inside() {
    thread_local bool in = false;
    return in;
  }

  // This thread's parts of the current job: t, t + threads, ...
  void work(int t) {
    inside() = true;
    for (std::int64_t p = t; p < job_.parts; p += threads_) {
      try {
        job_.call(job_.fn, p);
      } catch (...) {
        const std::lock_guard lock(mu_);
        if (!error_) error_ = std::current_exception();
      }
    }
    inside() = false;
  }

  void serve(int t) {
    std::uint64_t seen = 0;
    for (;;) {
      const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(50);
      while (generation_.load(std::memory_order_acquire) == seen && std::chrono::steady_clock::now() < until)
        std::this_thread::yield();
      {
        std::unique_lock lock(mu_);
        wake_.wait(lock, [&] { return generation_.load(std::memory_order_acquire) != seen; });
        seen = generation_.load(std::memory_order_acquire);
        if (stop_) return;
      }
      work(t);
      if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
        const std::lock_guard lock(mu_);  // the caller checks pending_ under mu_ before sleeping
        done_.notify_one();
      }
    }
  }

  const int threads_;
  std::vector<std::thread> helpers_;
  std::mutex run_mu_;  // one run at a time; others run inline
  std::mutex mu_;
  std::condition_variable wake_, done_;
  std::atomic<std::uint64_t> generation_{0};
  std::atomic<int> pending_{0};
  Job job_;
  std::exception_ptr error_;
  bool stop_ = false;
};

namespace detail {
inline std::unique_ptr<Workers>& workers() {
  static std::unique_ptr<Workers> w;
  return w;
}
}  // namespace detail

// Gives this process's host ops n threads (n >= 1; 1 removes the helpers). Not while ops run.
inline void set_threads(int n) {
  if (n < 1) throw Error("host::set_threads", cat("threads ", n), "give at least 1 thread");
  auto& w = detail::workers();
  w.reset();
  if (n > 1) w = std::make_unique<Workers>(n);
}

// How many threads the host ops have (1 unless set_threads gave more).
inline int threads() { return detail::workers() ? detail::workers()->threads() : 1; }

// f(p) for every p in [0, parts), on the host ops' threads (see Workers::run).
template <class F>
void parallel(std::int64_t parts, F&& f) {
  if (auto& w = detail::workers()) w->run(parts, std::forward<F>(f));
  else
    for (std::int64_t p = 0; p < parts; ++p) f(p);
}

// Splits [0, n) into at most threads() parts of whole `unit`s, the last part taking the rest too,
// and runs f(lo, hi) on each (see parallel). Fewer than two whole units: f(0, n) here. An op whose
// elements do not depend on where a part begins (rows, aligned chunks) gives the same bits on any
// number of threads.
template <class F>
void split(std::int64_t n, std::int64_t unit, F&& f) {
  const std::int64_t units = unit > 0 ? n / unit : 0, want = std::min<std::int64_t>(threads(), units);
  if (want <= 1) {
    if (n > 0) f(std::int64_t{0}, n);
    return;
  }
  const std::int64_t per_units = (units + want - 1) / want, per = per_units * unit;
  const std::int64_t parts = (units + per_units - 1) / per_units;
  parallel(parts, [&](std::int64_t p) { f(p * per, p + 1 == parts ? n : (p + 1) * per); });
}

// The smallest parts worth a thread for the ops' host specializations: elements of
// elementwise ops (a multiple of the float fast paths' chunks, detail::kChunk in ops.hpp, so every
// chunk starts where it does on one thread), rows of row ops, columns of column sums.
inline constexpr std::int64_t kElements = 16384, kRows = 16, kColumns = 64;

}  // namespace weft::host
