// MFU ceilings on the GPU: the GEMM rate measured in the run, and the data-sheet dense peak of the
// GPUs weft is measured on.
//
// Include only from .cu translation units.
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <utility>

#include "weft/ops/all.cuh"

namespace weft::train {

// FLOP/s of cuBLASLt multiplying (n, n) x (n, n) matrices of T for about `seconds` on `d`.
template <class T>
double cuda_gemm_rate(Cuda& d, std::int64_t n = 4096, double seconds = 0.3) {
  Allocation a = d.allocate(n * n * static_cast<std::int64_t>(sizeof(T)));
  Allocation c = d.allocate(n * n * static_cast<std::int64_t>(sizeof(T)));
  ops::Memory<Cuda>::fill(d, static_cast<T*>(a.data()), n * n, T(0.5f));
  auto once = [&] {
    ops::Gemm<Cuda>::run(d, Trans::no, Trans::no, n, n, n, 1.0f, static_cast<const T*>(a.data()), n,
                         static_cast<const T*>(a.data()), n, 0.0f, static_cast<T*>(c.data()), n);
  };
  once();  // the heuristic and the workspace, outside the timing
  d.synchronize();
  const auto start = std::chrono::steady_clock::now();
  std::int64_t reps = 0;
  double dt = 0;
  do {
    for (int i = 0; i < 10; ++i) once();
    d.synchronize();
    reps += 10;
    dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  } while (dt < seconds);
  return 2.0 * static_cast<double>(n * n * n) * static_cast<double>(reps) / dt;
}

// The dense tensor-core peak (no sparsity) of GPU 0 from NVIDIA's data sheets, bf16 or TF32 (f32),
// with a phrase naming it; nullopt for GPUs not in the table.
inline std::optional<std::pair<std::string, double>> datasheet_peak(bool bf16) {
  cudaDeviceProp p{};
  if (cudaGetDeviceProperties(&p, 0) != cudaSuccess) {
    (void)cudaGetLastError();
    return std::nullopt;
  }
  const std::string gpu = p.name;
  struct Row {
    const char* name;
    double bf16, tf32;
  };
  constexpr Row rows[] = {{"H200", 989e12, 494e12}, {"H100", 989e12, 494e12}, {"A100", 312e12, 156e12}};
  for (const Row& r : rows)
    if (gpu.find(r.name) != std::string::npos)
      return std::pair{cat(gpu, "'s dense ", bf16 ? "bf16" : "f32 (TF32 tensor-core)", " peak"),
                       bf16 ? r.bf16 : r.tf32};
  return std::nullopt;
}

}  // namespace weft::train
