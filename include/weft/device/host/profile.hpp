// Where a host step's time goes, by op class: every host op's call (ops/*.hpp) adds its wall time to the
// calling thread's OpTimes while one is set (host::profile(&times)), and costs one thread-local
// read otherwise. Benchmarks set it on each rank's thread (benchmarks/train_step); time outside
// every op is communication, allocation and the framework's own work.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>

namespace weft::host {

enum class Op : std::uint8_t {
  gemm,
  attention,
  gelu,
  layernorm,
  cross_entropy,
  optimizer,
  norm,
  embedding,
  elementwise,
  memory,
  rmsnorm,
  rotary,
  swiglu
};
inline constexpr std::size_t kOps = 13;

constexpr const char* name(Op op) {
  constexpr const char* names[] = {"gemm",      "attention", "gelu",      "layernorm",   "cross_entropy",
                                   "optimizer", "grad_norm", "embedding", "elementwise", "memory",
                                   "rmsnorm",   "rotary",    "swiglu"};
  return names[static_cast<std::size_t>(op)];
}

struct OpTimes {
  std::array<double, kOps> seconds{};
  std::array<std::int64_t, kOps> calls{};
  double total() const {
    double t = 0;
    for (double s : seconds) t += s;
    return t;
  }
};

inline OpTimes*& profile_target() {
  thread_local OpTimes* target = nullptr;
  return target;
}
// Records this thread's op times into `t` from now on (nullptr: stop).
inline void profile(OpTimes* t) { profile_target() = t; }

// Adds the time of its scope to the thread's OpTimes, if one is set.
class Timed {
 public:
  explicit Timed(Op op) : op_(op), into_(profile_target()) {
    if (into_) start_ = std::chrono::steady_clock::now();
  }
  Timed(const Timed&) = delete;
  Timed& operator=(const Timed&) = delete;
  ~Timed() {
    if (!into_) return;
    const auto i = static_cast<std::size_t>(op_);
    into_->seconds[i] += std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    ++into_->calls[i];
  }

 private:
  Op op_;
  OpTimes* into_;
  std::chrono::steady_clock::time_point start_{};
};

}  // namespace weft::host
