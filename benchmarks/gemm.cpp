// The host GEMM libraries on a training step's own GEMM shapes, one thread each (weft runs one
// thread per rank): Eigen (host::eigen_gemm), weft's host::gemm (which runs one of the others,
// named by host::gemm_library()) and every CBLAS library given or found at Debian's paths
// (OpenBLAS, with the kernels OPENBLAS_CORETYPE or its CPU table chooses, and BLIS), each loaded
// with dlopen so that one binary measures them all in the same run. Per shape, GFLOP/s of each; per library, the step's
// GEMM seconds (each shape times its count in a step) and the ratio to Eigen. One JSON object per line; this is the
// measurement behind WEFT_HOST_GEMM's default (docs/performance.md).
//
//   gemm [--model gpt2-124m|small] [--lib /path/to/libcblas.so ...] [--reps 5]
#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>
#include <weft/device/host/gemm.hpp>

using namespace weft;
using Clock = std::chrono::steady_clock;

namespace {

// CBLAS's sgemm, row-major (101), no transpose (111) or transpose (112).
using Sgemm = void (*)(int, int, int, int, int, int, float, const float*, int, const float*, int, float, float*, int);

struct Shape {
  std::string what;
  Trans ta, tb;
  std::int64_t m, n, k, count;  // count: how many per step
};

// A step's GEMMs (nn/linear.hpp, nn/stages.hpp, host attention): each Linear's forward (x W^T),
// input gradient (dy W) and weight gradient (dy^T x); the tied head's three; the attention core's
// six per (sequence, head).
std::vector<Shape> step_shapes(std::int64_t L, std::int64_t C, std::int64_t H, std::int64_t T, std::int64_t V,
                               std::int64_t B) {
  const std::int64_t N = B * T, hd = C / H;
  std::vector<Shape> s;
  for (auto [name, out, in] : {std::tuple{"qkv", 3 * C, C}, {"proj", C, C}, {"fc", 4 * C, C}, {"fc2", C, 4 * C}}) {
    s.push_back({std::string(name) + " forward", Trans::no, Trans::yes, N, out, in, L});
    s.push_back({std::string(name) + " dx", Trans::no, Trans::no, N, in, out, L});
    s.push_back({std::string(name) + " dW", Trans::yes, Trans::no, out, in, N, L});
  }
  s.push_back({"head forward", Trans::no, Trans::yes, N, V, C, 1});
  s.push_back({"head dW", Trans::yes, Trans::no, V, C, N, 1});
  s.push_back({"head dx", Trans::no, Trans::no, N, C, V, 1});
  const std::int64_t per_head = L * B * H;
  s.push_back({"attention q k^T, dout v^T", Trans::no, Trans::yes, T, T, hd, 2 * per_head});
  s.push_back({"attention P v, dS k", Trans::no, Trans::no, T, hd, T, 2 * per_head});
  s.push_back({"attention dS^T q, P^T dout", Trans::yes, Trans::no, T, hd, T, 2 * per_head});
  return s;
}

template <class F>
double best_seconds(int reps, F f) {
  f();  // warm-up
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = Clock::now();
    f();
    best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return best;
}

struct Library {
  std::string name;
  Sgemm sgemm = nullptr;  // null: Eigen, or host::gemm (weft)
  bool weft = false;
};

}  // namespace

int main(int argc, char** argv) {
  std::string model = "gpt2-124m";
  std::vector<std::string> paths;
  int reps = 5;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i], v = argv[i + 1];
    if (a == "--model" && (v == "gpt2-124m" || v == "small")) model = v;
    else if (a == "--lib") paths.push_back(v);
    else if (a == "--reps" && std::atoi(v.c_str()) > 0) reps = std::atoi(v.c_str());
    else {
      std::fprintf(stderr, "gemm: bad option %s %s; use --model gpt2-124m|small, --lib PATH, --reps N (> 0)\n",
                   a.c_str(), v.c_str());
      return 2;
    }
  }
  if (paths.empty())
    // One OpenBLAS only: its builds share a soname, and dlopen returns the one already loaded (the
    // threaded build weft links, set to one thread).
    for (const char* p :
         {"/usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblas.so.0",
          "/usr/lib/x86_64-linux-gnu/blis-openmp/libblis.so.4", "/usr/lib/x86_64-linux-gnu/blis-pthread/libblis.so.4"})
      if (std::filesystem::exists(p)) paths.emplace_back(p);
  setenv("BLIS_NUM_THREADS", "1", 1);  // before BLIS reads it: one thread, as weft runs
  setenv("OMP_NUM_THREADS", "1", 1);
  std::vector<Library> libs{{"eigen", nullptr}};
  const std::string weft_gemm = host::gemm_library();
  if (weft_gemm != "eigen") libs.push_back({"weft: " + weft_gemm, nullptr, true});
  for (const std::string& p : paths) {
    // RTLD_DEEPBIND: a library's CBLAS wrapper calls its own sgemm_, not the one of the OpenBLAS
    // weft links (which would otherwise interpose, and BLIS would measure as OpenBLAS).
    void* h = dlopen(p.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND);
    auto* f = h ? reinterpret_cast<Sgemm>(dlsym(h, "cblas_sgemm")) : nullptr;
    if (!f) {
      std::fprintf(stderr, "gemm: %s has no cblas_sgemm (%s); skipped\n", p.c_str(), h ? "no symbol" : dlerror());
      continue;
    }
    std::string name = p;
    if (auto* threads = reinterpret_cast<void (*)(int)>(dlsym(h, "openblas_set_num_threads"))) threads(1);
    if (auto* core = reinterpret_cast<char* (*)()>(dlsym(h, "openblas_get_corename")))
      name += std::string(" (") + core() + ")";
    libs.push_back({name, f});
  }
  const auto shapes = model == "small" ? step_shapes(4, 256, 4, 128, 256, 8) : step_shapes(12, 768, 12, 64, 50304, 4);
  std::vector<double> step(libs.size(), 0.0);
  for (const Shape& s : shapes) {
    const std::int64_t ar = s.ta == Trans::yes ? s.k : s.m, ac = s.ta == Trans::yes ? s.m : s.k;
    const std::int64_t br = s.tb == Trans::yes ? s.n : s.k, bc = s.tb == Trans::yes ? s.k : s.n;
    std::vector<float> a(static_cast<std::size_t>(ar * ac)), b(static_cast<std::size_t>(br * bc)),
        c(static_cast<std::size_t>(s.m * s.n));
    for (std::size_t i = 0; i < a.size(); ++i) a[i] = static_cast<float>(i % 17) * 0.01f;
    for (std::size_t i = 0; i < b.size(); ++i) b[i] = static_cast<float>(i % 13) * 0.01f;
    nlohmann::json row{{"bench", "gemm"},    {"model", model}, {"shape", s.what},          {"m", s.m},
                       {"n", s.n},           {"k", s.k},       {"ta", s.ta == Trans::yes}, {"tb", s.tb == Trans::yes},
                       {"per_step", s.count}};
    const double flops = 2.0 * static_cast<double>(s.m * s.n * s.k);
    for (std::size_t l = 0; l < libs.size(); ++l) {
      const Sgemm f = libs[l].sgemm;
      const double t = best_seconds(reps, [&] {
        if (libs[l].weft)
          host::gemm<float>(s.ta, s.tb, s.m, s.n, s.k, 1.0f, a.data(), ac, b.data(), bc, 0.0f, c.data(), s.n);
        else if (!f)
          host::eigen_gemm<float>(s.ta, s.tb, s.m, s.n, s.k, 1.0f, a.data(), ac, b.data(), bc, 0.0f, c.data(), s.n);
        else
          f(101, s.ta == Trans::yes ? 112 : 111, s.tb == Trans::yes ? 112 : 111, static_cast<int>(s.m),
            static_cast<int>(s.n), static_cast<int>(s.k), 1.0f, a.data(), static_cast<int>(ac), b.data(),
            static_cast<int>(bc), 0.0f, c.data(), static_cast<int>(s.n));
      });
      row["gflops"][libs[l].name] = flops / t / 1e9;
      step[l] += t * static_cast<double>(s.count);
    }
    std::printf("%s\n", row.dump().c_str());
  }
  for (std::size_t l = 0; l < libs.size(); ++l)
    std::printf("%s\n", nlohmann::json{{"bench", "gemm"},
                                       {"model", model},
                                       {"library", libs[l].name},
                                       {"step_gemm_s", step[l]},
                                       {"speedup_over_eigen", step[0] / step[l]},
                                       {"weft_uses", weft_gemm}}
                            .dump()
                            .c_str());
  return 0;
}
