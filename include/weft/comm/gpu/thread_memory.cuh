// Thread ranks sharing one GPU: the Memory (memory.hpp) of a rank whose buffers are on a Cuda device.
//
// Every rank is a thread with its own Cuda device object (its own stream) on the same GPU; one
// process, one context, so every rank's device pointers are valid on every thread. Before a rank
// posts a collective it synchronizes its stream (its kernels have written the buffers); copies
// between ranks' buffers run on the copying rank's stream and complete before the call returns;
// reductions run one kernel over the ranks' buffers, adding in rank order 0 .. n-1 per element (bf16
// in float), so results are bitwise those of the host's thread back end whatever the thread timing.
// Host buffers (a loss, a norm) are left to the communicator's host path. The deadline, mismatch and
// failure rules are the thread back end's: they act before any data moves.
//
// Usage, per rank:   Cuda dev(0);  world.set_memory(std::make_shared<threads::CudaMemory>(dev));
//
// Include only from .cu translation units.
#pragma once

#include <cuda_bf16.h>

#include <limits>
#include <memory>

#include "weft/comm/threads/memory.hpp"
#include "weft/device/cuda/device.hpp"

namespace weft::threads {

namespace detail {

template <class T> struct cuda_elem {
  using type = T;
  using acc = T;
};
template <> struct cuda_elem<bf16> {
  using type = __nv_bfloat16;
  using acc = float;
};

__device__ inline float widen_dev(__nv_bfloat16 x) { return __bfloat162float(x); }
template <class T> __device__ inline T widen_dev(T x) { return x; }
template <class T, class A> __device__ inline T narrow_dev(A x) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) return __float2bfloat16(x);
  else return static_cast<T>(x);
}

template <class T, class A>
__global__ void reduce_ranks_kernel(T* out, const T* const* ins, int n, std::int64_t lo, std::int64_t hi, bool max,
                                    std::int64_t offset) {
  for (std::int64_t i = lo + blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < hi;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    A acc = widen_dev(ins[0][i]);
    for (int r = 1; r < n; ++r) {
      const A v = widen_dev(ins[r][i]);
      if (!max) acc += v;
      else acc = (v > acc || v != v) ? v : acc;  // max that propagates NaN, as on the host
    }
    out[i - offset] = narrow_dev<T>(acc);
  }
}

}  // namespace detail

class CudaMemory final : public Memory {
 public:
  explicit CudaMemory(Cuda& dev) : dev_(&dev) {}

  void publish() override { dev_->synchronize(); }

  void copy(void* dst, const void* src, std::size_t bytes) override {
    if (!bytes) return;
    dev_->copy(dst, src, bytes);
    dev_->synchronize();
  }

  // A device buffer's slice in one piece: each reduce launches a kernel and each copy waits for it.
  std::size_t chunk_bytes(const void* buffer) const override {
    return on_device(buffer) ? std::numeric_limits<std::size_t>::max() / 2 : Memory::chunk_bytes(buffer);
  }

  bool reduce(void* out, const void* const* ins, int n, std::int64_t lo, std::int64_t hi, ReduceOp op, DType t,
              std::int64_t offset) override {
    if (!on_device(out)) return false;
    // The ranks' input pointers, to the device.
    Allocation table = dev_->allocate(n * static_cast<std::int64_t>(sizeof(void*)), Category::communication);
    dev_->from_host(table.data(), ins, static_cast<std::size_t>(n) * sizeof(void*));
    switch (t) {
      case DType::f32: launch<float>(out, table.data(), n, lo, hi, op, offset); break;
      case DType::f64: launch<double>(out, table.data(), n, lo, hi, op, offset); break;
      case DType::bf16: launch<bf16>(out, table.data(), n, lo, hi, op, offset); break;
      case DType::i32: launch<std::int32_t>(out, table.data(), n, lo, hi, op, offset); break;
      case DType::i64: launch<std::int64_t>(out, table.data(), n, lo, hi, op, offset); break;
      case DType::f16: throw Error("threads::CudaMemory", "f16 buffers are not reduced", "use bf16 or f32");
    }
    dev_->synchronize();
    return true;
  }

 private:
  static bool on_device(const void* p) {
    cudaPointerAttributes a{};
    if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
      (void)cudaGetLastError();
      return false;
    }
    return a.type == cudaMemoryTypeDevice;
  }

  template <class T>
  void launch(void* out, void* table, int n, std::int64_t lo, std::int64_t hi, ReduceOp op, std::int64_t offset) {
    using E = typename detail::cuda_elem<T>::type;
    using A = typename detail::cuda_elem<T>::acc;
    const std::int64_t count = hi - lo;
    const unsigned blocks = static_cast<unsigned>(std::min<std::int64_t>((count + 255) / 256, 65535 * 8));
    detail::reduce_ranks_kernel<E, A><<<blocks, 256, 0, dev_->stream()>>>(
        static_cast<E*>(out), static_cast<const E* const*>(table), n, lo, hi, op == ReduceOp::max, offset);
    cuda::check_launch("threads::CudaMemory::reduce");
  }

  Cuda* dev_;
};

}  // namespace weft::threads
