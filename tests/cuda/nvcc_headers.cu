// The host headers compile under nvcc (as every CUDA translation unit of later parts will include
// them), and what they compute there is right: 2 thread ranks all-reduce and redistribute.
#include <cstdio>

#include "weft/weft.hpp"

__global__ void touch(int* x) { *x = 1; }  // a kernel in the same TU, so nvcc compiles device code too

int main() {
  int bad = 0;
  weft::run_threads(2, [&](weft::ThreadComm& world) {
    weft::Mesh mesh{world, {.tensor = 2}};
    weft::Host host;
    auto x = weft::Tensor<double, weft::TensorSharded<1>, weft::Host>::empty(host, {3, 4}, mesh.spread());
    for (std::int64_t i = 0; i < x.numel(); ++i) x[i] = static_cast<double>(x.global_index(i));
    auto y = weft::redistribute<weft::Replicated>(x, mesh);
    for (std::int64_t i = 0; i < y.numel(); ++i)
      if (y[i] != static_cast<double>(i)) bad = 1;
  });
  std::printf("nvcc-compiled host code: %s\n", bad ? "WRONG" : "ok");
  return bad;
}
