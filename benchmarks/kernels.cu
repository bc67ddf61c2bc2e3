// GPU kernels at GPT-2 124M sizes (B=16, T=1024, C=768, V=50304), each against a ceiling measured
// in the same run: memory-bound ops as GB/s against a large device-to-device copy, GEMMs as TFLOP/s
// against a large cuBLASLt bf16 GEMM. One JSON object per line; each time is the median of 10 runs
// after 3 warm-ups, timed with CUDA events. The FP8 GEMM (ops/scaled_gemm.cuh) against bf16's at
// 4096 x 8192 x 16384 (compiled, not yet run: no GPU was lent since it was written).
//
//   kernels [--quick]     (--quick: B=4 and fewer repetitions, for a smoke run)
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "weft/device/cuda/gemm.cuh"
#include "weft/ops/cross_entropy.cuh"
#include "weft/ops/embedding.cuh"
#include "weft/ops/gelu.cuh"
#include "weft/ops/layernorm.cuh"
#include "weft/ops/memory.cuh"
#include "weft/ops/scaled_gemm.cuh"
#include "weft/ops/update.cuh"

using weft::Allocation;
using weft::bf16;
using weft::Cuda;
using weft::Error;
using idx = weft::cuda::index;
namespace host = weft::host;
namespace math = weft::math;
namespace wc = weft::cuda;

namespace {

int reps = 10;

double time_ms(Cuda& d, const std::function<void()>& f) {
  cudaEvent_t a, b;
  wc::check(cudaEventCreate(&a), "event");
  wc::check(cudaEventCreate(&b), "event");
  for (int i = 0; i < 3; ++i) f();
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    wc::check(cudaEventRecord(a, d.stream()), "record");
    f();
    wc::check(cudaEventRecord(b, d.stream()), "record");
    wc::check(cudaEventSynchronize(b), "sync");
    float ms = 0;
    wc::check(cudaEventElapsedTime(&ms, a, b), "elapsed");
    t.push_back(ms);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

template <class T>
T* buffer(Cuda& d, std::vector<Allocation>& keep, idx n, int fill = 0) {
  keep.push_back(d.allocate(n * static_cast<idx>(sizeof(T))));
  wc::check(cudaMemsetAsync(keep.back().data(), fill, static_cast<std::size_t>(n) * sizeof(T), d.stream()), "fill");
  return static_cast<T*>(keep.back().data());
}

// Small random-ish bf16 values (a bit pattern of about 0.01 .. 1), so that exp() and GELU see real numbers.
__global__ void fill_bf16(__nv_bfloat16* p, idx n, unsigned seed) {
  for (idx i = blockIdx.x * static_cast<idx>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<idx>(gridDim.x) * blockDim.x)
    p[i] = __float2bfloat16(0.01f * static_cast<float>(((i * 2654435761u + seed) >> 8) % 200) - 1.0f);
}

void report(const char* op, const char* dtype, double ms, double bytes, double flops, double copy_gbps,
            double gemm_tflops) {
  nlohmann::json j = {{"bench", "kernels"}, {"op", op}, {"dtype", dtype}, {"time_us", ms * 1e3}};
  if (bytes > 0) {
    j["gbps"] = bytes / ms / 1e6;
    j["copy_gbps"] = copy_gbps;
    j["fraction_of_copy"] = bytes / ms / 1e6 / copy_gbps;
  }
  if (flops > 0) {
    j["tflops"] = flops / ms / 1e9;
    j["gemm_tflops"] = gemm_tflops;
    j["fraction_of_gemm"] = flops / ms / 1e9 / gemm_tflops;
  }
  std::printf("%s\n", j.dump().c_str());
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  if (quick) reps = 3;
  try {
    Cuda d;
    wc::Blas blas(d);
    std::vector<Allocation> keep;
    const idx B = quick ? 4 : 16, T = 1024, C = 768, V = 50304, N = B * T;

    // Ceilings.
    const idx copy_bytes = idx{1} << 30;
    auto* src = buffer<char>(d, keep, copy_bytes, 1);
    auto* dst = buffer<char>(d, keep, copy_bytes);
    const double copy_ms = time_ms(d, [&] {
      wc::check(cudaMemcpyAsync(dst, src, static_cast<std::size_t>(copy_bytes), cudaMemcpyDeviceToDevice, d.stream()),
                "copy");
    });
    const double copy_gbps = 2.0 * copy_bytes / copy_ms / 1e6;  // read + write
    const idx G = 8192;
    auto* ga = buffer<bf16>(d, keep, G * G);
    auto* gb = buffer<bf16>(d, keep, G * G);
    auto* gc = buffer<bf16>(d, keep, G * G);
    fill_bf16<<<1024, 256, 0, d.stream()>>>(reinterpret_cast<__nv_bfloat16*>(ga), G * G, 1);
    fill_bf16<<<1024, 256, 0, d.stream()>>>(reinterpret_cast<__nv_bfloat16*>(gb), G * G, 2);
    const double gemm_ms =
        time_ms(d, [&] { blas.gemm<bf16>(host::Trans::no, host::Trans::no, G, G, G, ga, G, gb, G, gc, G); });
    const double gemm_tflops = 2.0 * G * G * G / gemm_ms / 1e9;
    report("copy (ceiling)", "-", copy_ms, 2.0 * copy_bytes, 0, copy_gbps, gemm_tflops);
    report("gemm 8192^3 (ceiling)", "bf16", gemm_ms, 0, 2.0 * G * G * G, copy_gbps, gemm_tflops);
    keep.clear();

    // Activations of one layer, bf16.
    auto* x = buffer<bf16>(d, keep, N * C);
    auto* res = buffer<bf16>(d, keep, N * C);
    auto* y = buffer<bf16>(d, keep, N * C);
    auto* w = buffer<bf16>(d, keep, C);
    auto* b = buffer<bf16>(d, keep, C);
    auto* mean = buffer<float>(d, keep, N);
    auto* rstd = buffer<float>(d, keep, N);
    auto* h = buffer<bf16>(d, keep, N * 4 * C);
    auto* hpre = buffer<bf16>(d, keep, N * 4 * C);
    auto* wfc = buffer<bf16>(d, keep, 4 * C * C);
    auto* bfc = buffer<bf16>(d, keep, 4 * C);
    for (bf16* p : {x, res, w, b, wfc, bfc})
      fill_bf16<<<1024, 256, 0, d.stream()>>>(
          reinterpret_cast<__nv_bfloat16*>(p),
          p == w || p == b ? C : (p == wfc ? 4 * C * C : (p == bfc ? 4 * C : N * C)), 3);
    const double e = 2;  // bytes per bf16

    report("layernorm_forward (+residual)", "bf16",
           time_ms(d, [&] { wc::layernorm_forward(d, y, mean, rstd, x, w, b, N, C, 1e-5f, y, res); }),
           e * N * C * 3 + 8.0 * N, 0, copy_gbps, gemm_tflops);
    report("layernorm_backward", "bf16",
           time_ms(d, [&] { wc::layernorm_backward(d, y, w, b, res, x, w, mean, rstd, N, C); }),
           e * N * C * 3 + 8.0 * N, 0, copy_gbps, gemm_tflops);
    report("gelu_forward", "bf16", time_ms(d, [&] { wc::gelu_forward(d, h, hpre, N * 4 * C); }), e * N * 4 * C * 2, 0,
           copy_gbps, gemm_tflops);
    report("gelu_backward", "bf16", time_ms(d, [&] { wc::gelu_backward(d, h, hpre, h, N * 4 * C); }), e * N * 4 * C * 3,
           0, copy_gbps, gemm_tflops);
    report("gemm fc + bias + gelu (N x 3072 x 768)", "bf16",
           time_ms(d,
                   [&] {
                     blas.gemm<bf16>(host::Trans::no, host::Trans::yes, N, 4 * C, C, x, C, wfc, C, h, 4 * C, 1, 0,
                                     wc::Epilogue::bias_gelu, bfc, hpre, 4 * C);
                   }),
           0, 2.0 * N * 4 * C * C, copy_gbps, gemm_tflops);
    report("gemm dgelu (N x 3072 x 768)", "bf16",
           time_ms(d,
                   [&] {
                     blas.gemm<bf16>(host::Trans::no, host::Trans::no, N, 4 * C, C, x, C, wfc, 4 * C, h, 4 * C, 1, 0,
                                     wc::Epilogue::dgelu, nullptr, hpre, 4 * C);
                   }),
           0, 2.0 * N * 4 * C * C, copy_gbps, gemm_tflops);
    keep.clear();

    // Embedding and the LM head's cross-entropy (V = 50304 on one rank).
    std::vector<std::int32_t> tok(static_cast<std::size_t>(N));
    for (std::size_t i = 0; i < tok.size(); ++i) tok[i] = static_cast<std::int32_t>((i * 2654435761u) % V);
    auto* tokens = buffer<std::int32_t>(d, keep, N);
    wc::check(cudaMemcpyAsync(tokens, tok.data(), tok.size() * 4, cudaMemcpyHostToDevice, d.stream()), "tokens");
    auto* table = buffer<bf16>(d, keep, V * C);
    auto* dtable = buffer<bf16>(d, keep, V * C);
    auto* act = buffer<bf16>(d, keep, N * C);
    report("embedding_forward", "bf16", time_ms(d, [&] { wc::embedding_forward(d, act, tokens, table, N, C, 0, V); }),
           e * N * C * 2, 0, copy_gbps, gemm_tflops);
    report("embedding_backward (deterministic)", "bf16",
           time_ms(d, [&] { wc::embedding_backward(d, dtable, act, tokens, N, C, 0, V); }), e * N * C * 3, 0, copy_gbps,
           gemm_tflops);
    keep.clear();
    auto* logits = buffer<bf16>(d, keep, N * V);
    fill_bf16<<<4096, 256, 0, d.stream()>>>(reinterpret_cast<__nv_bfloat16*>(logits), N * V, 5);
    auto* rowmax = buffer<float>(d, keep, N);
    auto* stats = buffer<float>(d, keep, 2 * N);
    tokens = buffer<std::int32_t>(d, keep, N);
    wc::check(cudaMemcpyAsync(tokens, tok.data(), tok.size() * 4, cudaMemcpyHostToDevice, d.stream()), "tokens");
    report("cross-entropy forward (max, sum exp)", "bf16",
           time_ms(d,
                   [&] {
                     wc::ce_row_max(d, rowmax, logits, N, V, V);
                     wc::ce_row_stats(d, stats, logits, rowmax, tokens, N, V, V, 0);
                   }),
           e * N * V * 2, 0, copy_gbps, gemm_tflops);
    report("cross-entropy backward (in place)", "bf16",
           time_ms(d, [&] { wc::ce_backward(d, logits, rowmax, stats, tokens, N, V, V, 0, 1.0f / N); }), e * N * V * 2,
           0, copy_gbps, gemm_tflops);
    keep.clear();

    // FP8 (issue 55's target: >= 1.3x bf16's TFLOP/s at 4096 x 8192 x 16384): cuBLASLt's FP8 GEMM
    // on operands cast beforehand (e4m3, one scale a tensor, and one a row), and the whole
    // ops::ScaledGemm from bf16 operands (amaxes, the host's look at them, casts, GEMM), each with
    // its ratio to the bf16 GEMM of the same shape measured here.
    {
      const idx M = 4096, Nn = 8192, K = 16384;
      auto* a = buffer<bf16>(d, keep, M * K);
      auto* b = buffer<bf16>(d, keep, Nn * K);
      auto* c = buffer<bf16>(d, keep, M * Nn);
      fill_bf16<<<1024, 256, 0, d.stream()>>>(reinterpret_cast<__nv_bfloat16*>(a), M * K, 3);
      fill_bf16<<<1024, 256, 0, d.stream()>>>(reinterpret_cast<__nv_bfloat16*>(b), Nn * K, 4);
      auto* a8 = buffer<std::uint8_t>(d, keep, M * K, 0x30);  // e4m3 0.5 (0x30): finite products
      auto* b8 = buffer<std::uint8_t>(d, keep, Nn * K, 0x30);
      auto* one = buffer<float>(d, keep, Nn);
      const std::vector<float> ones(static_cast<std::size_t>(Nn), 1.0f);
      d.from_host(one, ones.data(), ones.size() * sizeof(float));
      const double flops = 2.0 * M * Nn * K;
      const double bf16_ms =
          time_ms(d, [&] { blas.gemm<bf16>(host::Trans::no, host::Trans::yes, M, Nn, K, a, K, b, K, c, Nn); });
      const auto fp8 = [&](const char* op, const char* dtype, double ms) {
        nlohmann::json j = {{"bench", "kernels"},
                            {"op", op},
                            {"dtype", dtype},
                            {"time_us", ms * 1e3},
                            {"tflops", flops / ms / 1e9},
                            {"bf16_tflops", flops / bf16_ms / 1e9},
                            {"vs_bf16", bf16_ms / ms}};
        std::printf("%s\n", j.dump().c_str());
        std::fflush(stdout);
      };
      fp8("gemm 4096x8192x16384", "bf16", bf16_ms);
      for (bool vectors : {false, true})
        fp8(vectors ? "fp8 gemm 4096x8192x16384, rowwise scales" : "fp8 gemm 4096x8192x16384, tensorwise scale", "e4m3",
            time_ms(d, [&] {
              blas.gemm_fp8<bf16>(M, Nn, K, a8, CUDA_R_8F_E4M3, K, one, b8, CUDA_R_8F_E4M3, K, one, vectors, c, Nn,
                                  1.0f, 0.0f, true);
            }));
      using Tw = weft::fp8::Gemms<weft::fp8::scaling::Tensorwise>;
      fp8("fp8 ScaledGemm from bf16 (+casts), tensorwise", "e4m3", time_ms(d, [&] {
            weft::ops::ScaledGemm<Cuda>::run<Tw, weft::fp8::Operand::activation, weft::fp8::Operand::weight>(
                d, host::Trans::no, host::Trans::yes, M, Nn, K, 1.0f, a, K, b, K, 0.0f, c, Nn, "benchmark");
          }));
      keep.clear();
    }

    // AdamW and the gradient norm over 124M f32 parameters in 12 tensors.
    const idx P = 124'000'000 / 12;
    std::vector<wc::TensorRef> refs;
    for (int t = 0; t < 12; ++t)
      refs.push_back({buffer<float>(d, keep, P), buffer<float>(d, keep, P), buffer<float>(d, keep, P),
                      buffer<float>(d, keep, P), P, 1});
    const math::AdamW a{1e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.1f, 0.05f};
    report("adamw (124M params, multi-tensor)", "f32", time_ms(d, [&] { wc::adamw(d, refs, a); }), 4.0 * 12 * P * 7, 0,
           copy_gbps, gemm_tflops);
    report("gradient norm (124M, multi-tensor)", "f32", time_ms(d, [&] { (void)wc::sum_squares(d, refs); }),
           4.0 * 12 * P, 0, copy_gbps, gemm_tflops);
    return 0;
  } catch (const Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}
