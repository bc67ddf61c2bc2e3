// host::Workers and host::set_threads (device/host/workers.hpp): every part runs once, errors come
// back, nested and concurrent calls run inline; and every host op that splits over threads (GEMM,
// GELU, LayerNorm, attention, cross-entropy, Llama's SwiGLU, rotary and RMSNorm, AdamW, the
// gradient norm's sum of squares, the elementwise adds) gives the same bits on 1, 2 and 3 threads,
// alone and in a whole GPT forward and backward. Reference: one thread, bitwise (the parts are computed exactly as the
// whole: any difference is a splitting error).
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <mutex>
#include <set>
#include <stdexcept>
#include <thread>
#include <vector>

#include "nn/equivalence.hpp"
#include "weft/core/philox.hpp"
#include "weft/device/host/workers.hpp"
#include "weft/ops/all.hpp"
#include "weft/ops/rmsnorm.hpp"
#include "weft/ops/rotary.hpp"
#include "weft/ops/swiglu.hpp"
#include "weft/optim/optimizer.hpp"

using namespace weft;

namespace {

std::vector<float> random(std::size_t n, std::uint64_t seed, float scale = 1.0f) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = scale * static_cast<float>(weft::normal(seed, 0, i));
  return v;
}

// f() on 1 thread, then on 2 and 3: each result must equal the first, bit for bit.
template <class F>
void same_bits_on_threads(const char* what, F f) {
  host::set_threads(1);
  const auto one = f();
  for (int t : {2, 3}) {
    host::set_threads(t);
    CHECK_MESSAGE(f() == one, what, " differs on ", t, " threads");
  }
  host::set_threads(1);
}

}  // namespace

TEST_CASE("host::Workers: every part once, errors rethrown, nested and concurrent calls inline") {
  host::Workers w(3);
  CHECK(w.threads() == 3);
  for (std::int64_t parts : {0, 1, 2, 3, 7, 100}) {
    std::vector<std::atomic<int>> hits(static_cast<std::size_t>(parts));
    w.run(parts, [&](std::int64_t p) { ++hits[static_cast<std::size_t>(p)]; });
    for (std::int64_t p = 0; p < parts; ++p) CHECK(hits[static_cast<std::size_t>(p)] == 1);
  }
  // The parts run on the helpers too, not all on the caller: three parts that each wait (up to 10 s)
  // until three threads are inside one. A Workers that ran every part inline would fail here (one
  // thread), not hang.
  {
    std::mutex mu;
    std::condition_variable cv;
    std::set<std::thread::id> ids;
    w.run(3, [&](std::int64_t) {
      std::unique_lock lock(mu);
      ids.insert(std::this_thread::get_id());
      cv.notify_all();
      cv.wait_for(lock, std::chrono::seconds(10), [&] { return ids.size() >= 3; });
    });
    CHECK(ids.size() == 3);
  }
  // A part that throws: the error comes back to the caller, once the others have ended.
  std::atomic<int> ran{0};
  CHECK_THROWS_WITH_AS(w.run(6,
                             [&](std::int64_t p) {
                               ++ran;
                               if (p == 4) throw std::runtime_error("part 4 failed");
                             }),
                       "part 4 failed", std::runtime_error);
  CHECK(ran == 6);
  // Nested: a part's own run() runs its parts in order on its thread.
  std::vector<std::vector<std::int64_t>> inner(4);
  w.run(4, [&](std::int64_t p) { w.run(3, [&](std::int64_t q) { inner[static_cast<std::size_t>(p)].push_back(q); }); });
  for (const auto& v : inner) CHECK(v == std::vector<std::int64_t>{0, 1, 2});
  // Two callers at once (thread ranks sharing the process's helpers): both complete, one inline.
  std::vector<std::int64_t> a(1000, 0), b(1000, 0);
  std::thread other([&] {
    for (int rep = 0; rep < 50; ++rep) w.run(1000, [&](std::int64_t p) { a[static_cast<std::size_t>(p)] += 1; });
  });
  for (int rep = 0; rep < 50; ++rep) w.run(1000, [&](std::int64_t p) { b[static_cast<std::size_t>(p)] += 2; });
  other.join();
  CHECK(a == std::vector<std::int64_t>(1000, 50));
  CHECK(b == std::vector<std::int64_t>(1000, 100));
}

TEST_CASE("host::set_threads and split: parts of whole units, the last taking the rest, bad counts refused") {
  host::set_threads(3);
  CHECK(host::threads() == 3);
  std::vector<std::pair<std::int64_t, std::int64_t>> got(3, {-1, -1});
  host::split(100, 16, [&](std::int64_t lo, std::int64_t hi) { got[static_cast<std::size_t>(lo / 32)] = {lo, hi}; });
  // 6 whole units of 16 over 3 threads: 32 rows each, the last also taking rows 96 to 99.
  CHECK(got == std::vector<std::pair<std::int64_t, std::int64_t>>{{0, 32}, {32, 64}, {64, 100}});
  std::vector<std::pair<std::int64_t, std::int64_t>> one;
  host::split(31, 16, [&](std::int64_t lo, std::int64_t hi) { one.emplace_back(lo, hi); });  // one whole unit: no split
  CHECK(one == std::vector<std::pair<std::int64_t, std::int64_t>>{{0, 31}});
  host::set_threads(1);
  CHECK(host::threads() == 1);
  CHECK_THROWS_WITH_AS(host::set_threads(0), "host::set_threads: threads 0; give at least 1 thread", Error);
  CHECK_THROWS_WITH_AS(host::Workers(0), "host::Workers: threads 0; give between 1 and 1024 threads", Error);
}

TEST_CASE("the host's ops split over threads: the same bits as one thread, op by op") {
  Host dev;
  SUBCASE("GEMM: rows in blocks of 48, transposed or not, the last part with a partial block") {
    for (auto [ta, tb, m, n, k] : {std::tuple{Trans::no, Trans::yes, 290, 70, 33},
                                   {Trans::yes, Trans::no, 197, 64, 50},
                                   {Trans::yes, Trans::yes, 145, 31, 17}}) {
      const auto A = random(static_cast<std::size_t>(m * k), 1), B = random(static_cast<std::size_t>(k * n), 2);
      const std::int64_t lda = ta == Trans::yes ? m : k, ldb = tb == Trans::yes ? k : n;
      same_bits_on_threads("gemm", [&] {
        auto C = random(static_cast<std::size_t>(m * n), 3);  // beta 0.5: C read and scaled per part
        ops::Gemm<Host>::run<float, float>(dev, ta, tb, m, n, k, 1.5f, A.data(), lda, B.data(), ldb, 0.5f, C.data(), n);
        return C;
      });
    }
  }
  SUBCASE("GELU, its gradient and the residual add: 50000 elements, 16384 per part") {
    const auto x = random(50000, 4, 3.0f), d = random(50000, 5);
    same_bits_on_threads("gelu", [&] {
      std::vector<float> y(x.size()), dx(x.size()), r = d;
      ops::Gelu<Host>::forward(dev, y.data(), x.data(), 50000);
      ops::Gelu<Host>::backward(dev, dx.data(), x.data(), d.data(), 50000);
      ops::Memory<Host>::add(dev, r.data(), x.data(), 50000);
      y.insert(y.end(), dx.begin(), dx.end());
      y.insert(y.end(), r.begin(), r.end());
      return y;
    });
  }
  SUBCASE("LayerNorm forward and backward (rows; weight and bias gradients by columns), bias add") {
    const std::int64_t N = 100, C = 200;
    const auto x = random(N * C, 6), w = random(C, 7), b = random(C, 8), dy = random(N * C, 9), res = random(N * C, 10);
    same_bits_on_threads("layernorm", [&] {
      std::vector<float> y(x.size()), mean(N), rstd(N), dx(x.size()), dw(C, 0.25f), db(C, -0.5f), yb = x;
      ops::LayerNorm<Host>::forward(dev, y.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C, 1e-5f);
      ops::LayerNorm<Host>::backward(dev, dx.data(), dw.data(), db.data(), dy.data(), x.data(), w.data(), mean.data(),
                                     rstd.data(), N, C, res.data());
      ops::Bias<Host>::add(dev, yb.data(), b.data(), N, C);
      for (const auto* v : {&mean, &rstd, &dx, &dw, &db, &yb}) y.insert(y.end(), v->begin(), v->end());
      return y;
    });
  }
  SUBCASE("Llama's ops: SwiGLU (elements), rotary and RMSNorm (rows; the weight's gradient by columns)") {
    const std::int64_t N = 100, C = 200, n = 40000, B = 4, T = 25, G = 2, g = 2, hd = 8;
    const auto a = random(2 * n, 20, 3.0f), d = random(n, 21), x = random(N * C, 22), w = random(C, 23),
               dy = random(N * C, 24), res = random(N * C, 25), qkv = random(B * T * G * (g + 2) * hd, 26);
    const ops::Rope rope{.theta = 10000.0, .factor = 8.0, .original_max_positions = 8};
    same_bits_on_threads("llama ops", [&] {
      std::vector<float> y(n), da(2 * n), yn(N * C), rstd(N), dx(N * C), dw(C, 0.25f), r = qkv;
      ops::SwiGlu<Host>::forward(dev, y.data(), a.data(), n);
      ops::SwiGlu<Host>::backward(dev, da.data(), a.data(), d.data(), n);
      ops::RmsNorm<Host>::forward(dev, yn.data(), rstd.data(), x.data(), w.data(), N, C, 1e-5f);
      ops::RmsNorm<Host>::backward(dev, dx.data(), dw.data(), dy.data(), x.data(), w.data(), rstd.data(), N, C,
                                   res.data());
      ops::Rotary<Host>::forward(dev, r.data(), B, T, G, g, hd, rope, 3);
      for (const auto* v : {&da, &yn, &rstd, &dx, &dw, &r}) y.insert(y.end(), v->begin(), v->end());
      return y;
    });
  }
  SUBCASE("attention forward and backward: sequences split") {
    const std::int64_t B = 3, T = 40, H = 2, hd = 8;
    const auto qkv = random(B * T * H * 3 * hd, 11), dout = random(B * T * H * hd, 12);
    same_bits_on_threads("attention", [&] {
      std::vector<float> out(dout.size()), probs(B * H * T * T), dqkv(qkv.size());
      ops::Attention<Host>::forward(dev, out.data(), probs.data(), qkv.data(), B, T, H, hd);
      ops::Attention<Host>::backward(dev, dqkv.data(), dout.data(), qkv.data(), probs.data(), B, T, H, hd);
      out.insert(out.end(), probs.begin(), probs.end());
      out.insert(out.end(), dqkv.begin(), dqkv.end());
      return out;
    });
  }
  SUBCASE("cross-entropy: rows split") {
    const std::int64_t N = 70, V = 40, valid = 37;
    const auto logits = random(N * V, 13, 2.0f);
    std::vector<std::int32_t> targets(N);
    for (std::int64_t n = 0; n < N; ++n)
      targets[static_cast<std::size_t>(n)] = static_cast<std::int32_t>((n * 7) % valid);
    same_bits_on_threads("cross-entropy", [&] {
      std::vector<float> rowmax(N), stats(2 * N), sumexp(N), dlogits(logits.size());
      ops::CrossEntropy<Host>::row_max(dev, rowmax.data(), logits.data(), N, V, valid);
      ops::CrossEntropy<Host>::row_stats(dev, stats.data(), logits.data(), rowmax.data(), targets.data(), N, V, valid,
                                         0);
      const double loss = ops::CrossEntropy<Host>::loss(dev, sumexp.data(), stats.data(), rowmax.data(), N);
      ops::CrossEntropy<Host>::backward(dev, dlogits.data(), logits.data(), rowmax.data(), sumexp.data(),
                                        targets.data(), N, V, valid, 0, 1.0f / static_cast<float>(N));
      dlogits.push_back(static_cast<float>(loss));
      for (const auto* v : {&rowmax, &stats}) dlogits.insert(dlogits.end(), v->begin(), v->end());
      return dlogits;
    });
  }
  SUBCASE("the sum of squares of several ranges (the gradient norm): blocks of 16384, summed in order") {
    const auto x = random(90000, 18), y = random(20000, 19);
    const std::vector<std::pair<const float*, std::int64_t>> pieces{
        {x.data(), 90000}, {y.data(), 20000}, {x.data() + 7, 5}};
    same_bits_on_threads("sum_squares_many", [&] {
      return ops::Norm<Host>::sum_squares_many(dev, std::span<const std::pair<const float*, std::int64_t>>(pieces));
    });
    // Against the sum in double, element by element: the blocks only reorder a sum of squares.
    double ref = 0;
    for (const auto& [p, n] : pieces)
      for (std::int64_t i = 0; i < n; ++i) ref += static_cast<double>(p[i]) * static_cast<double>(p[i]);
    CHECK(ops::Norm<Host>::sum_squares_many(dev, std::span<const std::pair<const float*, std::int64_t>>(pieces)) ==
          doctest::Approx(ref).epsilon(1e-12));  // 110005 positive terms in double: reordering moves ~1e-13
  }
  SUBCASE("AdamW, one range and several") {
    const auto g = random(70000, 14);
    const math::AdamWParams<float> a{
        .lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f, .bc1 = 0.1f, .bc2 = 0.05f};
    same_bits_on_threads("adamw", [&] {
      auto p = random(70000, 15), m = random(70000, 16, 0.01f), v = random(70000, 17, 0.0f);
      ops::Update<Host>::adamw(dev, p.data(), g.data(), m.data(), v.data(), 40000, a, true, 0.5);
      using Piece = optim::Piece<float, float, 2>;
      const std::vector<Piece> pieces{
          {p.data() + 40000, g.data(), {m.data() + 40000, v.data() + 40000}, 20000, true},
          {p.data() + 60000, g.data() + 1, {m.data() + 60000, v.data() + 60000}, 10000, false}};
      ops::Update<Host>::adamw_many(dev, std::span<const Piece>(pieces), a, 0.5);
      p.insert(p.end(), m.begin(), m.end());
      p.insert(p.end(), v.begin(), v.end());
      return p;
    });
  }
}

TEST_CASE("a GPT forward and backward on one rank: the same loss, values and gradients on 1, 2 and 3 threads") {
  // Batch 16 of 16 tokens: 256 rows, so the GEMMs (blocks of 48 rows), GELU (16384 elements per
  // part), LayerNorm, attention and cross-entropy all split.
  const gpt2::Config c = test::tiny_config();
  same_bits_on_threads("gpt", [&] {
    const auto run = test::run_gpt<float, false, recompute::None>(1, c, 16);
    std::vector<double> all{run.loss};
    for (const auto* m : {&run.values, &run.grads})
      for (const auto& [name, v] : *m) all.insert(all.end(), v.begin(), v.end());
    return all;
  });
}
