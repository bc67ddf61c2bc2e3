// estimate::Rates measured on this host for a step's work (cost/time.hpp), with `data x tensor`
// thread ranks running at once, as a training run's ranks do: each GEMM shape of the step, the
// attention core at the step's shape, an elementwise op's bandwidth at the step's activation size,
// and the thread communicator's alpha and beta on groups of the tensor and data degrees. About a
// second in all at the sizes the tests and benchmarks use.
#pragma once

#include <algorithm>
#include <chrono>
#include <map>
#include <memory>
#include <span>
#include <tuple>
#include <vector>

#include "weft/comm/mesh.hpp"
#include "weft/comm/threads/run.hpp"
#include "weft/core/float8_scaling.hpp"
#include "weft/cost/time.hpp"
#include "weft/device/host/gemm.hpp"
#include "weft/device/host/host.hpp"
#include "weft/ops/all.hpp"

namespace weft::estimate {

namespace detail {

using Clock = std::chrono::steady_clock;

// The slowest rank's seconds per call of f(rank), `ranks` threads at once, after one warm-up call.
template <class F>
double per_call(int ranks, F&& f, double min_seconds = 0.05) {
  std::vector<double> t(static_cast<std::size_t>(ranks));
  run_threads(ranks, [&](ThreadComm& c) {
    f(c.rank());
    c.barrier();
    const auto t0 = Clock::now();
    std::int64_t calls = 0;
    double dt = 0;
    do {
      f(c.rank());
      ++calls;
      dt = std::chrono::duration<double>(Clock::now() - t0).count();
    } while (dt < min_seconds);
    t[static_cast<std::size_t>(c.rank())] = dt / static_cast<double>(calls);
  });
  double slowest = 0;
  for (double x : t) slowest = std::max(slowest, x);
  return slowest;
}

// Seconds of one all-reduce of n elements of T on the `axis` groups of a data x tensor mesh.
template <class T>
double all_reduce_seconds(MeshShape shape, Axis axis, std::int64_t n, int calls) {
  const int ranks = shape.data * shape.tensor;
  std::vector<double> t(static_cast<std::size_t>(ranks));
  run_threads(ranks, [&](ThreadComm& w) {
    Mesh mesh{w, shape};
    std::vector<T> buf(static_cast<std::size_t>(n), T(1));
    auto& g = mesh.comm(axis);
    g.all_reduce(std::span<T>(buf));
    w.barrier();
    const auto t0 = Clock::now();
    for (int i = 0; i < calls; ++i) g.all_reduce(std::span<T>(buf));  // the same count on every rank
    t[static_cast<std::size_t>(w.rank())] = std::chrono::duration<double>(Clock::now() - t0).count() / calls;
  });
  double slowest = 0;
  for (double x : t) slowest = std::max(slowest, x);
  return slowest;
}

template <class T>
Link measure_link(MeshShape shape, Axis axis, std::int64_t typical_bytes) {
  const int n = axis == Axis::tensor ? shape.tensor : shape.data;
  if (n <= 1) return {};
  const std::int64_t big = std::max<std::int64_t>(typical_bytes / static_cast<std::int64_t>(sizeof(T)), 1 << 14);
  const double small = all_reduce_seconds<T>(shape, axis, 1, 400), large = all_reduce_seconds<T>(shape, axis, big, 40);
  // Ring all-reduce: 2(n-1) alpha + 2 (n-1)/n S beta.
  const double alpha = small / (2.0 * (n - 1));
  const double beta = std::max(large - small, 0.0) / (2.0 * (n - 1) / n * static_cast<double>(big * sizeof(T)));
  return {alpha, beta};
}

}  // namespace detail

// Rates of this host for `w` (a step of gpt2::Model<P> with the given degrees and local batch rows N),
// measured with every rank of the mesh running. Each op is measured at its shape capped at
// kMeasured elements a buffer (a larger one at a smaller shape of the same kind, halving its largest
// dimension: 2^20 elements, 4 MiB of f32, past a core's L2): larger ops run at about the rate per
// FLOP or element of the capped one, and the plan of any size measures in seconds (a vocabulary of
// 2^40 once allocated terabytes here).
inline constexpr std::int64_t kMeasured = std::int64_t{1} << 20;

template <class T>
Rates host_rates(const Work& w, MeshShape shape, std::int64_t local_batch_given, std::int64_t seq_given,
                 std::int64_t heads, std::int64_t width) {
  const int ranks = shape.data * shape.tensor;
  Rates r;
  // Each GEMM shape once, stored as the layers store it.
  using Key = std::tuple<std::int64_t, std::int64_t, std::int64_t, bool, bool>;
  auto table = std::make_shared<std::map<Key, double>>();
  for (const Gemm& g : w.gemms) {
    const Key key{g.m, g.n, g.k, g.ta, g.tb};
    if (g.count == 0 || table->count(key)) continue;
    Gemm c = g;  // the shape measured: g's, its largest dimension halved while a buffer passes kMeasured
    const auto big = [](double x, double y) { return x * y > static_cast<double>(kMeasured); };
    while (big(c.m, c.k) || big(c.k, c.n) || big(c.m, c.n)) {
      std::int64_t& d = c.m >= c.n && c.m >= c.k ? c.m : c.n >= c.k ? c.n : c.k;
      d = std::max<std::int64_t>(1, d / 2);
    }
    std::vector<std::vector<T>> a(static_cast<std::size_t>(ranks)), b(a.size()), out(a.size());
    for (std::size_t i = 0; i < a.size(); ++i) {
      a[i].assign(static_cast<std::size_t>(c.m * c.k), T(0.5));
      b[i].assign(static_cast<std::size_t>(c.k * c.n), T(0.5));
      out[i].assign(static_cast<std::size_t>(c.m * c.n), T(0));
    }
    const auto ta = c.ta ? host::Trans::yes : host::Trans::no, tb = c.tb ? host::Trans::yes : host::Trans::no;
    const std::int64_t lda = c.ta ? c.m : c.k, ldb = c.tb ? c.k : c.n;
    const double s = detail::per_call(ranks, [&](int i) {
      const auto u = static_cast<std::size_t>(i);
      host::gemm<T>(ta, tb, c.m, c.n, c.k, T(1), a[u].data(), lda, b[u].data(), ldb, T(0), out[u].data(), c.n);
    });
    (*table)[key] = c.flops() / s;
  }
  r.gemm_flops = [table](const Gemm& g) { return table->at(Key{g.m, g.n, g.k, g.ta, g.tb}); };

  // The attention core, forward and backward, at the step's local shape (fewer sequences, then a
  // shorter one, while the probabilities pass kMeasured).
  const std::int64_t Hl = heads / shape.tensor, hd = width / heads;
  {
    std::int64_t local_batch = std::max<std::int64_t>(1, local_batch_given), seq = seq_given;
    while (static_cast<double>(local_batch) * Hl * seq * seq > static_cast<double>(kMeasured) && local_batch > 1)
      local_batch /= 2;
    while ((static_cast<double>(local_batch) * Hl * seq * seq > static_cast<double>(kMeasured) ||
            static_cast<double>(local_batch) * seq * Hl * hd * 3 > static_cast<double>(kMeasured)) &&
           seq > 16)
      seq /= 2;
    const std::int64_t n = local_batch * seq * Hl * hd;
    std::vector<std::vector<T>> qkv(static_cast<std::size_t>(ranks)), out(qkv.size()), probs(qkv.size()),
        dqkv(qkv.size());
    for (std::size_t i = 0; i < qkv.size(); ++i) {
      qkv[i].assign(static_cast<std::size_t>(3 * n), T(0.1));
      dqkv[i].assign(qkv[i].size(), T(0));
      out[i].assign(static_cast<std::size_t>(n), T(0.1));
      probs[i].assign(static_cast<std::size_t>(local_batch * Hl * seq * seq), T(0));
    }
    const double s = detail::per_call(ranks, [&](int i) {
      const auto u = static_cast<std::size_t>(i);
      host::attention_forward(out[u].data(), probs[u].data(), qkv[u].data(), local_batch, seq, Hl, hd);
      host::attention_backward(dqkv[u].data(), out[u].data(), qkv[u].data(), probs[u].data(), local_batch, seq, Hl, hd);
    });
    const double core = 2.0 * static_cast<double>(local_batch * Hl * seq * (seq + 1) * hd);
    r.attention_flops = 3 * core / s;
  }

  // The elementwise ops at the step's sizes: GELU on the hidden, LayerNorm on the stream, the
  // cross-entropy on the logits, AdamW on the updated range (at most 2^20 elements).
  const Elementwise& n = w.elementwise;
  // Below, the step's local batch and sequence: the elementwise ops' sizes, capped as the GEMMs'.
  const std::int64_t local_batch = local_batch_given, seq = seq_given;
  const auto rate_of = [&](std::int64_t count, auto&& op) {
    const auto len = static_cast<std::size_t>(std::clamp<std::int64_t>(count, 1, kMeasured));
    std::vector<std::vector<T>> x(static_cast<std::size_t>(ranks)), y(x.size()), z(x.size());
    for (std::size_t i = 0; i < x.size(); ++i) {
      x[i].assign(len, T(0.25));
      y[i].assign(len, T(0.5));
      z[i].assign(len, T(0));
    }
    const double s = detail::per_call(ranks, [&](int i) {
      const auto u = static_cast<std::size_t>(i);
      op(x[u].data(), y[u].data(), z[u].data(), static_cast<std::int64_t>(len));
    });
    return static_cast<double>(len) / s;
  };
  const std::int64_t hidden = local_batch * seq * (4 * width / shape.tensor);
  r.elements.gelu = rate_of(hidden, [](T* x, T* y, T* z, std::int64_t len) {
    host::gelu_forward(y, x, len);
    host::gelu_backward(z, x, y, len);
  });
  const std::int64_t rows = std::max<std::int64_t>(1, static_cast<std::int64_t>(n.layernorm) / width);
  const std::int64_t ln_rows = std::min<std::int64_t>(rows, local_batch * seq);
  {
    std::vector<T> wb(static_cast<std::size_t>(2 * width), T(1));
    r.elements.layernorm = rate_of(ln_rows * width, [&](T* x, T* y, T* z, std::int64_t len) {
      const std::int64_t N = len / width;
      std::vector<T> stats(static_cast<std::size_t>(2 * N)), dwb(static_cast<std::size_t>(2 * width), T(0));
      host::layernorm_forward<T, T>(y, stats.data(), stats.data() + N, x, wb.data(), wb.data() + width, N, width,
                                    T(1e-5));
      host::layernorm_backward<T, T>(z, dwb.data(), dwb.data() + width, y, x, wb.data(), stats.data(), stats.data() + N,
                                     N, width);
    });
  }
  const std::int64_t vocab_local = std::clamp<std::int64_t>(
      static_cast<std::int64_t>(n.cross_entropy / static_cast<double>(std::max<std::int64_t>(1, local_batch * seq))), 1,
      kMeasured);
  r.elements.cross_entropy = rate_of(std::max(vocab_local, std::min(local_batch * seq * vocab_local, kMeasured)),
                                     [&](T* x, T*, T* z, std::int64_t len) {
                                       const std::int64_t N = len / vocab_local;
                                       std::vector<T> rowmax(static_cast<std::size_t>(N)),
                                           stats(static_cast<std::size_t>(2 * N)), sumexp(rowmax.size());
                                       std::vector<std::int32_t> targets(static_cast<std::size_t>(N), 0);
                                       host::ce_row_max<T, T>(rowmax.data(), x, N, vocab_local, vocab_local);
                                       host::ce_row_stats<T, T>(stats.data(), x, rowmax.data(), targets.data(), N,
                                                                vocab_local, vocab_local, 0);
                                       host::ce_loss<T>(sumexp.data(), stats.data(), rowmax.data(), N);
                                       host::ce_backward<T, T>(z, x, rowmax.data(), sumexp.data(), targets.data(), N,
                                                               vocab_local, vocab_local, 0, T(1));
                                     });
  // The float8 casts (an FP8 step's: each GEMM operand's amax and cast, as ops::ScaledGemm runs them).
  if constexpr (std::same_as<T, float>)
    if (n.fp8_cast > 0)
      r.elements.fp8_cast = rate_of(std::min<std::int64_t>(static_cast<std::int64_t>(n.fp8_cast), 1 << 20),
                                    [](T* x, T*, T*, std::int64_t len) {
                                      (void)fp8::quantize<fp8::Tensorwise<float8_e4m3>>(
                                          std::span<const float>(x, static_cast<std::size_t>(len)), 1, len);
                                    });
  const math::AdamWParams<T> adam{};
  r.elements.adamw = rate_of(std::min<std::int64_t>(static_cast<std::int64_t>(n.adamw), 1 << 20),
                             [&](T* p, T* g, T* m, std::int64_t len) {
                               std::vector<T> v(static_cast<std::size_t>(len), T(0));
                               host::adamw(p, g, m, v.data(), len, adam, true);
                             });

  // Streaming bandwidth (out += x: two reads and a write) and the first touch of fresh memory
  // (the host allocator's block, written once, returned), at the size of the branch input.
  {
    const std::int64_t len = std::min(local_batch * seq * width, kMeasured);
    r.bandwidth = 3.0 * static_cast<double>(len * static_cast<std::int64_t>(sizeof(T))) *
                  rate_of(len, [](T* x, T* y, T*, std::int64_t k) { host::add_inplace(y, x, k); }) /
                  static_cast<double>(len);
    std::vector<Host> hosts(static_cast<std::size_t>(ranks));
    const double s = detail::per_call(ranks, [&](int i) {
      Allocation a =
          hosts[static_cast<std::size_t>(i)].allocate(len * static_cast<std::int64_t>(sizeof(T)), Category::other);
      host::fill(static_cast<T*>(a.data()), len, T(0));
    });
    r.first_touch = static_cast<double>(len * static_cast<std::int64_t>(sizeof(T))) / s;
  }

  const std::int64_t typical = std::min(local_batch * seq * width, kMeasured) * static_cast<std::int64_t>(sizeof(T));
  r.tensor = detail::measure_link<T>(shape, Axis::tensor, typical);
  r.data = detail::measure_link<T>(shape, Axis::data, typical);
  r.expert = r.data;  // the expert group is data ranks
  return r;
}

}  // namespace weft::estimate
