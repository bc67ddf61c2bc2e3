// How a thread rank's collectives touch its buffers: the host's memory by default, or a device's
// (ranks that share one GPU, comm/gpu/thread_memory.cuh).
//
// Thread ranks move data by reading each other's buffers directly. For host buffers that is memcpy
// and a loop; for buffers on a GPU that all ranks share (one process, one context), it is a device
// copy and a reduction kernel, after each rank has made its queued work visible (publish: its
// stream synchronized) before it posts a collective. A Memory decides per call whether a buffer is
// its device's, so host scalars (a loss, a norm) and device tensors go through the same
// communicator.
//
// This header is plain C++20.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "weft/comm/communicator.hpp"

namespace weft::threads {

class Memory {
 public:
  virtual ~Memory() = default;
  // Before this rank posts a collective or a send: its queued writes to the buffers are complete.
  virtual void publish() {}
  // bytes from src to dst, complete on return (either may be any rank's buffer).
  virtual void copy(void* dst, const void* src, std::size_t bytes) {
    if (bytes) std::memcpy(dst, src, bytes);
  }
  // How many bytes of `buffer` an all-reduce reduces and passes on at a time: a cache-sized chunk
  // for host memory, so the copies read what the reduction just wrote.
  virtual std::size_t chunk_bytes(const void* /*buffer*/) const { return std::size_t{64} << 10; }
  // out[i - offset] = op over ranks 0 .. n-1 in order of ins[r][i], for i in [lo, hi), elements of
  // type t (bf16 accumulated in float). Returns false when the buffers are host memory, which the
  // communicator then reduces itself.
  virtual bool reduce(void* /*out*/, const void* const* /*ins*/, int /*n*/, std::int64_t /*lo*/, std::int64_t /*hi*/,
                      ReduceOp /*op*/, DType /*t*/, std::int64_t /*offset*/) {
    return false;
  }
};

}  // namespace weft::threads
