// Helpers for the CUDA tests: device buffers, poisoning, random inputs, comparisons, and the skip
// rule (a test that needs a GPU exits with code 77 where there is none, which CTest reports as
// skipped, never as passed).
#pragma once

#include <cuda_runtime.h>
#include <doctest/doctest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "support/error.hpp"
#include "weft/core/bf16.hpp"
#include "weft/core/philox.hpp"
#include "weft/device/cuda/device.hpp"

namespace weft::test {

// The GPU, or an exit: 77 (skipped) where this machine has none, 1 (failed) where it has one that
// the CUDA runtime cannot use (a broken or mismatched driver must not pass as "no GPU").
inline Cuda& gpu() {
  const cuda::Probe found = cuda::probe();
  if (found.count == 0 && !found.absent) {
    std::printf("FAILED: this machine has an NVIDIA driver but no usable CUDA device: %s\n", found.why.c_str());
    std::fflush(stdout);
    std::exit(1);
  }
  if (found.count == 0) {
    std::printf("SKIPPED: no CUDA device on this machine\n");
    std::fflush(stdout);
    std::exit(77);
  }
  static Cuda device;
  return device;
}

template <class T>
double to_double(T x) {
  if constexpr (std::is_same_v<T, bf16>) return static_cast<float>(x);
  else return static_cast<double>(x);
}
template <class T>
T from_double(double x) {
  if constexpr (std::is_same_v<T, bf16>) return bf16(static_cast<float>(x));
  else return static_cast<T>(x);
}

// n values of N(0, scale^2), rounded to T.
template <class T>
std::vector<T> random(std::size_t n, std::uint64_t seed, double scale = 1.0) {
  std::vector<T> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = from_double<T>(scale * weft::normal(seed, 11, i));
  return v;
}
template <class T>
std::vector<double> widen(const std::vector<T>& v) {
  std::vector<double> d(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) d[i] = to_double(v[i]);
  return d;
}

// A device copy of a host vector, or an uninitialized one poisoned with 0xFF bytes (NaN in float and
// bf16), so that an element the op fails to write shows up in the comparison.
template <class T>
struct DeviceVec {
  Allocation mem;
  std::size_t n = 0;
  DeviceVec(Cuda& d, std::size_t count) : mem(d.allocate(static_cast<std::int64_t>(count * sizeof(T)))), n(count) {
    cuda::check(cudaMemsetAsync(mem.data(), 0xFF, count * sizeof(T), d.stream()), "poison");
  }
  DeviceVec(Cuda& d, const std::vector<T>& h) : DeviceVec(d, h.size()) {
    cuda::check(cudaMemcpyAsync(mem.data(), h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice, d.stream()),
                "upload");
    d.synchronize();
  }
  T* data() { return static_cast<T*>(mem.data()); }
  std::vector<T> get(Cuda& d) const {
    std::vector<T> h(n);
    cuda::check(cudaMemcpyAsync(h.data(), mem.data(), n * sizeof(T), cudaMemcpyDeviceToHost, d.stream()), "download");
    d.synchronize();
    return h;
  }
};

// max |got - want| / max |want| (NaN anywhere: infinity).
template <class T>
double rel_error(const std::vector<T>& got, const std::vector<double>& want) {
  double diff = 0, scale = 0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    const double g = to_double(got[i]);
    if (std::isnan(g)) return INFINITY;
    diff = test::worse(diff, std::fabs(g - want[i]));
    scale = std::max(scale, std::fabs(want[i]));
  }
  return got.size() != want.size() ? INFINITY : diff / std::max(scale, 1e-300);
}

// f32: 1e-5 relative; bf16: stated per op (at most 1e-2), for the rounding of the output to 8 bits.
template <class T>
constexpr double tolerance(double bf16_tol) {
  return std::is_same_v<T, float> ? 1e-5 : bf16_tol;
}

}  // namespace weft::test
