// The GPU half of 03_custom_model: the Cuda device's specializations of the example's two ops
// (float), then the same model and steps on one GPU and on the host, side by side. Built where a
// CUDA compiler is (custom_model_cuda); scripts/gpu-check runs it.
//
//   custom_model_cuda [--steps N]
#include <weft/weft.hpp>

#include <cmath>
#include <cstdio>

#include "03_custom_model.hpp"
#include "cli.hpp"

namespace custom {

// One thread per row: small widths only (the example's); a real kernel would use a warp per row.
__global__ void rmsnorm_forward_kernel(float* y, float* rstd, const float* x, const float* w, std::int64_t N,
                                       std::int64_t C, float eps) {
  const std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
  if (i >= N) return;
  float ss = 0;
  for (std::int64_t c = 0; c < C; ++c) ss += x[i * C + c] * x[i * C + c];
  rstd[i] = rsqrtf(ss / static_cast<float>(C) + eps);
  for (std::int64_t c = 0; c < C; ++c) y[i * C + c] = x[i * C + c] * rstd[i] * w[c];
}
__global__ void rmsnorm_dx_kernel(float* dx, const float* dy, const float* x, const float* w, const float* rstd,
                                  std::int64_t N, std::int64_t C) {
  const std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
  if (i >= N) return;
  float m = 0;
  for (std::int64_t c = 0; c < C; ++c) m += x[i * C + c] * rstd[i] * w[c] * dy[i * C + c];
  m /= static_cast<float>(C);
  for (std::int64_t c = 0; c < C; ++c) dx[i * C + c] = rstd[i] * (w[c] * dy[i * C + c] - x[i * C + c] * rstd[i] * m);
}
// One thread per column, rows in order: no atomics, the same bits every run.
__global__ void rmsnorm_dw_kernel(float* dw, const float* dy, const float* x, const float* rstd, std::int64_t N,
                                  std::int64_t C) {
  const std::int64_t c = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
  if (c >= C) return;
  float s = 0;
  for (std::int64_t i = 0; i < N; ++i) s += x[i * C + c] * rstd[i] * dy[i * C + c];
  dw[c] += s;
}
__global__ void relu_squared_kernel(float* out, const float* x, const float* dy, std::int64_t n) {
  const std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) out[i] = x[i] > 0 ? (dy ? 2 * x[i] * dy[i] : x[i] * x[i]) : 0.0f;
}

inline unsigned blocks(std::int64_t n) { return static_cast<unsigned>((n + 127) / 128); }

template <>
struct RmsNorm<Cuda> {
  static void forward(Cuda& d, float* y, float* rstd, const float* x, const float* w, std::int64_t N, std::int64_t C,
                      float eps) {
    if (N > 0) rmsnorm_forward_kernel<<<blocks(N), 128, 0, d.stream()>>>(y, rstd, x, w, N, C, eps);
    weft::cuda::check_launch("custom::RmsNorm<Cuda>::forward");
  }
  static void backward(Cuda& d, float* dx, float* dw, const float* dy, const float* x, const float* w,
                       const float* rstd, std::int64_t N, std::int64_t C) {
    if (N == 0) return;
    rmsnorm_dx_kernel<<<blocks(N), 128, 0, d.stream()>>>(dx, dy, x, w, rstd, N, C);
    rmsnorm_dw_kernel<<<blocks(C), 128, 0, d.stream()>>>(dw, dy, x, rstd, N, C);
    weft::cuda::check_launch("custom::RmsNorm<Cuda>::backward");
  }
};

template <>
struct ReluSquared<Cuda> {
  static void forward(Cuda& d, float* y, const float* x, std::int64_t n) {
    if (n > 0) relu_squared_kernel<<<blocks(n), 128, 0, d.stream()>>>(y, x, nullptr, n);
    weft::cuda::check_launch("custom::ReluSquared<Cuda>::forward");
  }
  static void backward(Cuda& d, float* dx, const float* x, const float* dy, std::int64_t n) {
    if (n > 0) relu_squared_kernel<<<blocks(n), 128, 0, d.stream()>>>(dx, x, dy, n);
    weft::cuda::check_launch("custom::ReluSquared<Cuda>::backward");
  }
};

}  // namespace custom

using namespace weft;

namespace {

template <class D>
D make_device() {
  if constexpr (std::same_as<D, Cuda>) return Cuda(0);
  else return D{};
}

// `steps` AdamW steps of the model on device D (one thread rank), the losses on the host.
template <class D>
std::vector<double> losses(int steps, const gpt2::Config& c) {
  std::vector<double> out;
  const data::MarkovSource corpus(c.vocab, 3);
  run_threads(1, [&](ThreadComm& world) {
    D dev = make_device<D>();
    if constexpr (std::same_as<D, Cuda>) world.set_memory(std::make_shared<threads::CudaMemory>(dev));
    Mesh mesh{world, {}};
    custom::Model<float, false, D> model(dev, c, mesh.spread(), 8);
    auto dp = optim::data_parallel<optim::Ddp>(model, optim::AdamW{.config = {.lr = 3e-3}}, mesh);
    data::Loader<data::MarkovSource> loader(corpus, c.seq, 8, 1, 0);
    std::vector<std::int32_t> x, y;
    for (int step = 0; step < steps; ++step) {
      dp.zero_grad();
      loader.next(x, y);
      auto ctx = model.in_flight({{x, y}, 8});
      out.push_back(pipeline::forward_backward(model, ctx, mesh, dp, true));
      dp.step(3e-3, 1.0);
    }
  });
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"custom_model_cuda: the custom decoder on one GPU beside the host"};
  int steps = 20;
  app.add_option("--steps", steps, "optimizer steps")->check(examples::at_least(1))->check(examples::at_most(10000));
  if (const auto stop = examples::parse(app, argc, argv)) return *stop;
  const gpt2::Config c{.vocab = 48, .seq = 16, .layers = 2, .heads = 4, .width = 32, .seed = 7, .init_std = 0.1};
  std::vector<double> gpu, host;
  try {
    gpu = losses<Cuda>(steps, c);
    host = losses<Host>(steps, c);
  } catch (const Error& e) {  // no GPU, or a failing one: said, never an abort
    std::fprintf(stderr, "custom_model_cuda: %s\n", e.what());
    return 1;
  }
  double worst = 0;
  for (int s = 0; s < steps; ++s) {
    const auto i = static_cast<std::size_t>(s);
    std::printf("step %3d  loss on the GPU %.5f  on the host %.5f\n", s + 1, gpu[i], host[i]);
    const double d = std::fabs(gpu[i] - host[i]) / host[i];
    if (!(d <= worst)) worst = d;  // a NaN loss makes the worst NaN, which fails below
  }
  // f32 on both, different sums: 1e-3 relative after a few steps of Adam is a wide margin.
  std::printf("largest relative difference %.3g (%s)\n", worst, worst < 1e-3 ? "within 1e-3" : "OVER 1e-3");
  return worst < 1e-3 ? 0 : 1;
}
