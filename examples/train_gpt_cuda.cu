// train_gpt's GPU half (nvcc): every strategy, in f32 and bf16 mixed precision, with the thread
// ranks sharing one GPU (each its own stream; collectives move device memory). Built into train_gpt
// in CUDA builds; train_gpt.cpp calls it for --device cuda.
#include "weft/comm/threads/cuda_memory.cuh"
#include "weft/device/cuda/dispatch.cuh"

#include "train_gpt.hpp"

namespace train_gpt {

namespace {

// The dense tensor-core peaks (no sparsity) of the GPUs weft is measured on, by name, from NVIDIA's
// data sheets; other GPUs report MFU against the measured GEMM ceiling only.
std::optional<std::pair<std::string, double>> datasheet_peak(const std::string& gpu, bool bf16) {
  struct Row {
    const char* name;
    double bf16, tf32;
  };
  constexpr Row rows[] = {{"H200", 989e12, 494e12}, {"H100", 989e12, 494e12}, {"A100", 312e12, 156e12}};
  for (const Row& r : rows)
    if (gpu.find(r.name) != std::string::npos)
      return std::pair{cat(gpu, "'s dense ", bf16 ? "bf16" : "f32 (TF32 tensor-core)", " peak"), bf16 ? r.bf16 : r.tf32};
  return std::nullopt;
}

}  // namespace

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
    constexpr std::int64_t n = 4096;
    Allocation a = d.allocate(n * n * static_cast<std::int64_t>(sizeof(T))), c = d.allocate(n * n * static_cast<std::int64_t>(sizeof(T)));
    Ops<Cuda>::fill(d, static_cast<T*>(a.data()), n * n, T(0.5f));
    auto once = [&] {
      Ops<Cuda>::gemm(d, Trans::no, Trans::no, n, n, n, 1.0f, static_cast<const T*>(a.data()), n,
                      static_cast<const T*>(a.data()), n, 0.0f, static_cast<T*>(c.data()), n);
    };
    once();
    d.synchronize();
    const auto start = std::chrono::steady_clock::now();
    std::int64_t reps = 0;
    double dt = 0;
    do {
      for (int i = 0; i < 10; ++i) once();
      d.synchronize();
      reps += 10;
      dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    } while (dt < 0.3);
    return 2.0 * static_cast<double>(n * n * n) * static_cast<double>(reps) / dt;
  }
  template <class T>
  static std::optional<std::pair<std::string, double>> dense_peak() {
    cudaDeviceProp p{};
    if (cudaGetDeviceProperties(&p, 0) != cudaSuccess) return std::nullopt;
    return datasheet_peak(p.name, std::same_as<T, bf16>);
  }
};

int cuda_devices() { return weft::cuda::device_count(); }

int train_on_cuda(const Options& o, const nn::GptConfig& cfg, const Corpus& corpus) {
  return with_strategy(o, [&]<class S, bool SP>() {
    if (o.dtype == "bf16") return train<Cuda, Bf16Mixed, SP, S>(o, cfg, corpus);
    return train<Cuda, F32, SP, S>(o, cfg, corpus);
  });
}

}  // namespace train_gpt
