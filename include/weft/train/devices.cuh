// The training loop's GPU half (nvcc): DeviceSupport<Cuda> (each rank's device and the
// communicator's memory for it, how the ranks run, the GEMM ceiling and the datasheet peak for MFU,
// NVTX ranges for Nsight Systems), which the loop of a unit on the GPU (train/unit.hpp: Unit<F,
// Cuda, SP>) needs. Ranks are threads sharing one GPU (each its own stream; collectives move device
// memory), or one rank per process and GPU under mpirun or an env launcher (torchrun, srun), NCCL
// between them. A binary's CUDA units include it (cmake/WeftTrainer.cmake writes them).
#pragma once

#include <nvtx3/nvToolsExt.h>

#ifndef WEFT_NO_NCCL  // scripts/gpu-check on a machine without NCCL: thread ranks only
#include "weft/comm/nccl/bootstrap.cuh"
#endif
#include "weft/comm/gpu/thread_memory.cuh"
#include "weft/ops/all.cuh"
#include "weft/train/cuda_metrics.cuh"
#include "weft/train/devices.hpp"
#include "weft/train/loop.hpp"
#include "weft/train/strategies.hpp"

namespace weft::train {

template <>
struct DeviceSupport<Cuda> {
  // Thread ranks: each its own Cuda (stream) on GPU 0, and the communicator moves device memory.
  static std::shared_ptr<Cuda> make(ThreadComm& world) {
    auto d = std::make_shared<Cuda>(0);
    world.set_memory(std::make_shared<threads::CudaMemory>(*d));
    return d;
  }
#ifndef WEFT_NO_NCCL
  // A process's rank: the NCCL world's device (its stream orders the collectives after the compute).
  static std::shared_ptr<Cuda> make(nccl::NcclComm& world) { return {std::shared_ptr<Cuda>{}, &world.device()}; }
#endif

  // Threads sharing GPU 0, or this process's rank on its GPU (the launcher's local rank modulo the
  // GPUs), in an NCCL world bootstrapped over MPI or over the env launcher's TCP store.
  template <class Body>
  static void run_ranks(const Launch& l, int ranks, const Options& o, Body&& body) {
    if (l.kind == Launcher::threads) {
      run_threads(ranks, std::forward<Body>(body), {.deadline = deadline_of(o.launch)});
      return;
    }
#ifdef WEFT_NO_NCCL
    throw Error(o.where(cat("--launcher ", name(l.kind))), "this binary was built without NCCL",
                "install NCCL and rebuild, or use --launcher threads");
#else
    Cuda dev(nccl::device_for(l.gpu));
    if (l.kind == Launcher::env) {
      auto world = nccl::world_from_env(dev, env_ranks(), deadline_of(o.launch));
      body(world);  // a rank that throws exits; the others' next collective ends at the deadline
      return;
    }
#ifdef WEFT_ENABLE_MPI
    auto host = mpi::MpiComm::world({.deadline = deadline_of(o.launch)});
    auto world = nccl::world_from_mpi(dev, host);
    mpi::run(host, [&](mpi::MpiComm&) { body(world); });
#else
    throw Error(o.where("--launcher mpi"), "this binary was built without MPI", "install libopenmpi-dev and rebuild");
#endif
#endif
  }

  // cuBLASLt on (4096, 4096) x (4096, 4096) in T for about 0.3 s: the GEMM ceiling of this GPU.
  template <class T>
  static double gemm_ceiling(int, int gpu) {
    Cuda d(gpu % weft::cuda::device_count());
    return train::cuda_gemm_rate<T>(d);
  }
  // The trace's ranges as NVTX ranges, for Nsight Systems.
  static void ranges(pipeline::Trace& t) {
    t.push = [](const char* n) { nvtxRangePushA(n); };
    t.pop = [] { nvtxRangePop(); };
  }
  template <class T>
  static std::optional<std::pair<std::string, double>> dense_peak() {
    return train::datasheet_peak(std::same_as<T, bf16>);
  }
};

}  // namespace weft::train
