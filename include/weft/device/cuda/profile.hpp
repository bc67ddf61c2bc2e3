// Per-op GPU time by kind, for benchmarks: while a Profile is attached to a Cuda device
// (dev.profile = &p), every op's Cuda specialization (ops/*.cuh) records a pair of CUDA events on the device's
// stream around every operation it runs, and collect() sums the elapsed times per kind. The events cost a few
// microseconds per op; detach (nullptr) for undisturbed timing.
#pragma once

#include <cuda_runtime.h>

#include <array>
#include <vector>

#include "weft/device/cuda/device.hpp"

namespace weft::cuda {

enum class OpKind : std::uint8_t { gemm, attention, other };
inline constexpr const char* kOpKindNames[] = {"gemm", "attention", "other_kernels"};

class Profile {
 public:
  explicit Profile(Cuda& d) : dev_(&d) {}
  Profile(const Profile&) = delete;
  Profile& operator=(const Profile&) = delete;
  ~Profile() {
    for (auto [a, b] : events_) {
      (void)cudaEventDestroy(a);
      (void)cudaEventDestroy(b);
    }
  }

  void begin(OpKind k) {
    if (used_ == events_.size()) {
      cudaEvent_t a = nullptr, b = nullptr;
      check(cudaEventCreate(&a), "Profile (event)");
      check(cudaEventCreate(&b), "Profile (event)");
      events_.emplace_back(a, b);
      kinds_.push_back(k);
    }
    kinds_[used_] = k;
    check(cudaEventRecord(events_[used_].first, dev_->stream()), "Profile (record)");
  }
  void end() {
    check(cudaEventRecord(events_[used_].second, dev_->stream()), "Profile (record)");
    ++used_;
  }

  // Waits for the stream; milliseconds per kind since the last collect().
  std::array<double, 3> collect() {
    dev_->synchronize();
    std::array<double, 3> ms{};
    for (std::size_t i = 0; i < used_; ++i) {
      float t = 0;
      check(cudaEventElapsedTime(&t, events_[i].first, events_[i].second), "Profile (elapsed)");
      ms[static_cast<std::size_t>(kinds_[i])] += t;
    }
    used_ = 0;
    return ms;
  }

 private:
  Cuda* dev_;
  std::vector<std::pair<cudaEvent_t, cudaEvent_t>> events_;
  std::vector<OpKind> kinds_;
  std::size_t used_ = 0;
};

// Times one op where a benchmark attached a Profile to the device (the ops' calls).
struct Timed {
  Cuda& d;
  Timed(Cuda& dev, OpKind k) : d(dev) {
    if (d.profile) d.profile->begin(k);
  }
  ~Timed() {
    if (d.profile) d.profile->end();
  }
  Timed(const Timed&) = delete;
  Timed& operator=(const Timed&) = delete;
};

}  // namespace weft::cuda
