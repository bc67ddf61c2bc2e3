// The Cuda device: one GPU, one stream, and a stream-ordered allocator with per-category accounting.
//
// Allocations are plain device memory from cudaMallocAsync on the device's stream (never managed
// memory); the driver's memory pool caches freed blocks, so steady-state training allocates without
// system calls. The accounting (current and peak bytes per category, per rank) is weft's, as on the
// host. Constructing a Cuda device where there is no GPU throws weft::Error; nothing crashes.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <system_error>

#include "weft/device/allocation.hpp"
#include "weft/device/cuda/check.hpp"

namespace weft {

namespace cuda {

class Profile;  // profile.hpp

// Whether this machine has an NVIDIA kernel driver loaded (a GPU machine, whatever the runtime says).
inline bool nvidia_driver_loaded() {
  std::error_code ec;
  return std::filesystem::exists("/proc/driver/nvidia/version", ec) || std::filesystem::exists("/dev/nvidiactl", ec);
}

// What the CUDA runtime finds on this machine. `count` usable devices, or none: then `absent` when
// there is no GPU to use (cudaErrorNoDevice, or no NVIDIA driver at all, which the runtime reports as
// an insufficient driver), and otherwise `why` says how a GPU machine fails (a driver too old for
// this toolkit or not matching its kernel module, a device the runtime cannot open). The tests skip
// where a GPU is absent and fail where it fails: "no GPU" and "a GPU that fails" differ.
struct Probe {
  int count = 0;
  bool absent = false;
  std::string why;  // the runtime's error where it failed
};

inline Probe probe() {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e == cudaSuccess) return {n, n == 0, {}};
  (void)cudaGetLastError();  // clear the sticky error
  const bool absent = e == cudaErrorNoDevice || (e == cudaErrorInsufficientDriver && !nvidia_driver_loaded());
  return {0, absent, cat("cudaGetDeviceCount: ", cudaGetErrorName(e), " (", cudaGetErrorString(e), ")")};
}

// The number of usable CUDA devices (0 when there is no GPU, no driver, or a GPU that fails:
// probe() tells those apart).
inline int device_count() { return probe().count; }

// Free bytes on `device` now (cudaMemGetInfo), or -1 when it cannot be read.
inline std::int64_t free_bytes(int device) {
  int before = 0;
  if (cudaGetDevice(&before) != cudaSuccess || cudaSetDevice(device) != cudaSuccess) {
    (void)cudaGetLastError();
    return -1;
  }
  std::size_t free = 0, total = 0;
  const bool ok = cudaMemGetInfo(&free, &total) == cudaSuccess;
  if (!ok) (void)cudaGetLastError();
  (void)cudaSetDevice(before);
  return ok ? static_cast<std::int64_t>(free) : -1;
}

class Allocator final : public Releaser {
 public:
  explicit Allocator(cudaStream_t s) : stream_(s) {}
  Allocator(const Allocator&) = delete;
  Allocator& operator=(const Allocator&) = delete;

  Allocation allocate(std::int64_t bytes, Category c) {
    if (bytes < 0) throw Error("cuda::Allocator", cat("requested ", bytes, " bytes"), "request a size >= 0");
    void* p = nullptr;
    if (bytes > 0) {
      const cudaError_t e = cudaMallocAsync(&p, static_cast<std::size_t>(bytes), stream_);
      if (e != cudaSuccess) {
        (void)cudaGetLastError();
        throw Error("cuda::Allocator",
                    cat("cannot allocate ", bytes, " bytes of ", name(c), " with ", stats_.total_current,
                        " bytes in use (", cudaGetErrorString(e), ")"),
                    "reduce the batch or model size, or use more ranks");
      }
    }
    stats_.on_allocate(bytes, c);
    return make(p, bytes, c);
  }
  const MemoryStats& stats() const { return stats_; }
  void reset_peak() { stats_.reset_peak(); }

  void release(void* p, std::int64_t bytes, Category c) noexcept override {
    if (p) (void)cudaFreeAsync(p, stream_);
    stats_.on_release(bytes, c);
  }

 private:
  Allocation make(void* p, std::int64_t bytes, Category c) { return Allocation::adopt(this, p, bytes, c); }
  cudaStream_t stream_;
  MemoryStats stats_;
};

}  // namespace cuda

class Cuda {
 public:
  static constexpr const char* name = "cuda";
  static constexpr bool host_memory = false;  // buffers are read on the host through to_host()

  explicit Cuda(int device = 0) {
    const cuda::Probe found = cuda::probe();
    const int n = found.count;
    if (n == 0 && !found.absent)
      throw Error("Cuda", cat("the NVIDIA driver is loaded but the CUDA runtime finds no usable device: ", found.why),
                  "check nvidia-smi, and that the driver supports this CUDA toolkit");
    if (n == 0)
      throw Error("Cuda", "no CUDA device is visible (no GPU, or no driver)",
                  "run on a machine with an NVIDIA GPU, or use the Host device");
    if (device < 0 || device >= n)
      throw Error("Cuda", cat("device ", device, " requested but ", n, " are visible"),
                  cat("use a device in [0, ", n, ")"));
    device_ = device;
    cuda::check(cudaSetDevice(device), "cudaSetDevice");
    cuda::check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
    allocator_ = new cuda::Allocator(stream_);
  }
  Cuda(const Cuda&) = delete;
  Cuda& operator=(const Cuda&) = delete;
  ~Cuda() {
    (void)cudaStreamSynchronize(stream_);
    handles.reset();  // before the allocator its workspace came from
    delete allocator_;
    (void)cudaStreamDestroy(stream_);
  }

  Allocation allocate(std::int64_t bytes, Category c = Category::other) { return allocator_->allocate(bytes, c); }
  const MemoryStats& memory() const { return allocator_->stats(); }
  void reset_peak() { allocator_->reset_peak(); }

  // Library handles the dispatch layer (dispatch.cuh) creates on first use and keeps per device
  // (the cuBLASLt handle and its workspace); released with the device.
  std::shared_ptr<void> handles;
  // Per-op timing by kind (profile.hpp), when a benchmark attaches one.
  cuda::Profile* profile = nullptr;
  cudaStream_t stream() const { return stream_; }
  int device() const { return device_; }
  void synchronize() const { cuda::check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize"); }

  // Memory moves, queued on the device's stream (the Device concept, device/host/host.hpp). Pointers
  // may be device or host memory (unified addressing); to_host waits for the copy to land.
  void zero(void* p, std::size_t bytes) {
    if (bytes) cuda::check(cudaMemsetAsync(p, 0, bytes, stream_), "cudaMemsetAsync");
  }
  void copy(void* dst, const void* src, std::size_t bytes) {
    if (bytes) cuda::check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream_), "cudaMemcpyAsync");
  }
  void copy_2d(void* dst, std::size_t dpitch, const void* src, std::size_t spitch, std::size_t width,
               std::size_t rows) {
    if (width && rows)
      cuda::check(cudaMemcpy2DAsync(dst, dpitch, src, spitch, width, rows, cudaMemcpyDefault, stream_),
                  "cudaMemcpy2DAsync");
  }
  void to_host(void* dst, const void* src, std::size_t bytes) {
    copy(dst, src, bytes);
    synchronize();
  }
  void from_host(void* dst, const void* src, std::size_t bytes) {
    copy(dst, src, bytes);
    synchronize();  // the host buffer may be reused as soon as this returns
  }

 private:
  int device_ = 0;
  cudaStream_t stream_ = nullptr;
  cuda::Allocator* allocator_ = nullptr;
};

}  // namespace weft
