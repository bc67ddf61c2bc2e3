// Thread ranks on the GPU for the tests: rank_device<Cuda> (nn/equivalence.hpp) gives each rank a
// Cuda device with its own stream on GPU 0, its communicator moving device buffers; it skips the
// test (exit 77) where there is no GPU.
#pragma once

#include "weft/comm/gpu/thread_memory.cuh"
#include "weft/ops/all.cuh"

#include "device/cuda/support.cuh"
#include "nn/equivalence.hpp"

namespace weft::test {
template <>
inline std::unique_ptr<Cuda> rank_device<Cuda>(ThreadComm& world) {
  (void)gpu();  // skips the test where there is no GPU
  auto d = std::make_unique<Cuda>(0);
  world.set_memory(std::make_shared<threads::CudaMemory>(*d));
  return d;
}
}  // namespace weft::test
