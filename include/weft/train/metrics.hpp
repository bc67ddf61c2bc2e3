// Training metrics: the host GEMM rate that MFU is measured against.
//
// A model says its FLOPs per token (the trainer's family: flops_per_token, as gpt2::flops_per_token
// does for GPT-2). MFU = achieved model FLOP/s divided by the
// GEMM rate all ranks reach together on this machine, measured at start-up with the same element
// type (the best of several windows): the ceiling that matters for a host run, whatever the processor.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <vector>

#include "weft/comm/threads/run.hpp"
#include "weft/device/host/gemm.hpp"

namespace weft::train {

// FLOP/s of `ranks` threads each multiplying (n, n) x (n, n) matrices of T through host::gemm at
// the same time, summed: each rank's best of `windows` windows of seconds / windows, so that one
// slow moment (another process, a page fault) does not lower the ceiling.
template <class T>
double gemm_rate(int ranks, std::int64_t n = 512, double seconds = 0.3, int windows = 5) {
  std::vector<double> rate(static_cast<std::size_t>(ranks));
  run_threads(ranks, [&](ThreadComm& c) {
    std::vector<T> a(static_cast<std::size_t>(n * n), T(0.5)), b(a), out(a);
    host::gemm<T>(host::Trans::no, host::Trans::no, n, n, n, T(1), a.data(), n, b.data(), n, T(0), out.data(), n);
    c.barrier();
    double best = 0;
    for (int w = 0; w < windows; ++w) {
      const auto start = std::chrono::steady_clock::now();
      std::int64_t reps = 0;
      double dt = 0;
      do {
        host::gemm<T>(host::Trans::no, host::Trans::no, n, n, n, T(1), a.data(), n, b.data(), n, T(0), out.data(), n);
        ++reps;
        dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      } while (dt < seconds / windows);
      best = std::max(best, 2.0 * static_cast<double>(n * n * n * reps) / dt);
    }
    rate[static_cast<std::size_t>(c.rank())] = best;
  });
  double total = 0;
  for (double r : rate) total += r;
  return total;
}

}  // namespace weft::train
