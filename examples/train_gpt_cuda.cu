// train_gpt's GPU half (nvcc): every strategy, in f32 and bf16 mixed precision, with the thread
// ranks sharing one GPU (each its own stream; collectives move device memory). Built into train_gpt
// in CUDA builds; train_gpt.cpp calls it for --device cuda.
#include <nvtx3/nvToolsExt.h>

#include "weft/comm/threads/cuda_memory.cuh"
#include "weft/device/cuda/dispatch.cuh"
#include "weft/train/cuda_metrics.cuh"

#include "train_gpt.hpp"

namespace train_gpt {

template <>
struct DeviceSupport<Cuda> {
  static std::unique_ptr<Cuda> make(ThreadComm& world) {
    auto d = std::make_unique<Cuda>(0);
    world.set_memory(std::make_shared<threads::CudaMemory>(*d));
    return d;
  }
  // cuBLASLt on (4096, 4096) x (4096, 4096) in T for about 0.3 s: the GEMM ceiling of this GPU.
  template <class T>
  static double gemm_ceiling(int) {
    Cuda d(0);
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

int cuda_devices() { return weft::cuda::device_count(); }

int train_on_cuda(const Options& o, const nn::GptConfig& cfg, const Corpus& corpus) {
  return with_strategy(o, [&]<class S, bool SP>() {
    if (o.dtype == "bf16") return train<Cuda, Bf16Mixed, SP, S>(o, cfg, corpus, Launch{});
    return train<Cuda, F32, SP, S>(o, cfg, corpus, Launch{});
  });
}

}  // namespace train_gpt
