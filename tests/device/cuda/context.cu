// ops::ContextBlock on the Cuda device (ops/context_block.cuh) against the host's in
// double on the same inputs: two blocks of keys and values merged into one output by their
// log-sum-exp, at a context rank's two-chunk positions (the rank's own block; one whose first
// chunk every query sees and whose second none does; one that only the queries' second chunk
// sees), then the backward over the same blocks, under each mask (causal; bidirectional;
// bidirectional with padding lengths in device memory). Grouped heads (g = 1, 2, 4), sizes that
// are not multiples of a warp. Tolerances: the sums in float against double, 1e-5 relative to the largest element (f32
// inputs); bf16 inputs are widened exactly, so the same bound holds for everything computed in
// float, and the bf16 outputs (finish, write_dqkv) get one rounding, 8e-3.
// Then the whole attention over the context axis, both types, on 2 and 4 thread ranks sharing the
// GPU (the blocks travel between device buffers), against the same on host thread ranks in double
// (which tests/context/attention.cpp holds to one rank's attention within 1e-12). Last, Llama's
// grouped-query attention layer with the sequence over context 2 on the GPU (f32) against the same
// layer on the host in double over the whole sequence, as tests/context/layer.cpp holds the host's.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <tuple>

#include "support.cuh"
#include "support/error.hpp"
#include "weft/comm/gpu/thread_memory.cuh"
#include "weft/comm/mesh.hpp"
#include "weft/comm/threads/run.hpp"
#include "weft/context/attention.hpp"
#include "weft/nn/context_attention.hpp"
#include "weft/nn/grouped_attention.hpp"
#include "weft/ops/all.cuh"
#include "weft/ops/context_block.cuh"

using namespace weft;
using namespace weft::test;
using V = std::vector<double>;

TEST_CASE_TEMPLATE("context attention blocks: forward merge, backward, packing, against the host in double", T, float,
                   bf16) {
  Cuda& d = gpu();
  Host h;
  using Gpu = ops::ContextBlock<Cuda>;
  using Ref = ops::ContextBlock<Host>;
  for (auto [B, Tl, H, g, hd] :
       {std::tuple<std::int64_t, std::int64_t, std::int64_t, std::int64_t, std::int64_t>{1, 6, 2, 1, 8},
        {2, 10, 4, 2, 16},
        {1, 34, 8, 4, 64}})
    for (int variant = 0; variant < 3; ++variant) {  // causal; bidirectional; bidirectional and padded
      CAPTURE(Tl);
      CAPTURE(g);
      CAPTURE(variant);
      const std::int64_t G = H / g, half = Tl / 2;
      // Padding that keeps a key of chunk 3 and hides the queries' second chunk's keys (chunk 4) and chunk 5.
      const std::vector<std::int32_t> lengths{static_cast<std::int32_t>(3 * half + 1),
                                              static_cast<std::int32_t>(4 * half - 1)};
      DeviceVec<std::int32_t> glengths(d, lengths);
      const ops::Mask hm{variant == 0, variant == 2 ? lengths.data() : nullptr},
          gm{variant == 0, variant == 2 ? glengths.data() : nullptr};
      const auto nq = static_cast<std::size_t>(B * Tl * G * (g + 2) * hd),
                 nkv = static_cast<std::size_t>(B * Tl * G * 2 * hd);
      const auto no = static_cast<std::size_t>(B * Tl * H * hd), nr = static_cast<std::size_t>(B * H * Tl);
      const auto qkv = random<T>(nq, 21), other = random<T>(nkv, 22), later = random<T>(nkv, 23),
                 dout = random<T>(no, 24);
      // The queries hold chunks 1 and 4 of 6 (positions half .. 2 half - 1 and 4 half ..); their own
      // block; one at chunks 0 and 5 (every key of chunk 0 visible, chunk 5 after every query); one
      // at chunks 2 and 3 (visible to the second chunk's queries only).
      const ops::Positions qpos(half, half, 4 * half), kother(0, half, 5 * half), klater(2 * half, half, 3 * half);
      DeviceVec<T> gq(d, qkv), gother(d, other), glater(d, later), gdout(d, dout), gmine(d, nkv), gout(d, no),
          gdqkv(d, nq);
      DeviceVec<float> go(d, no), glse(d, nr), gD(d, nr), gdq(d, std::vector<float>(nq, 0.f)),
          gdk(d, std::vector<float>(nkv, 0.f));
      Gpu::pack_kv(d, gmine.data(), gq.data(), B, Tl, H, hd, g);
      Gpu::start(d, go.data(), glse.data(), B, Tl, H, hd);
      for (auto [kv, kp] :
           {std::pair{gmine.data(), qpos}, std::pair{gother.data(), kother}, std::pair{glater.data(), klater}})
        Gpu::forward(d, go.data(), glse.data(), gq.data(), kv, B, Tl, H, hd, g, qpos, kp, gm);
      Gpu::finish(d, gout.data(), go.data(), static_cast<std::int64_t>(no));
      Gpu::row_dots(d, gD.data(), gdout.data(), gout.data(), B, Tl, H, hd);

      const V q = widen(qkv), ot = widen(other), lt = widen(later), dy = widen(dout);
      V mine(nkv), o(no), lse(nr), out(no), D(nr), dq(nq, 0.0);
      Ref::pack_kv(h, mine.data(), q.data(), B, Tl, H, hd, g);
      Ref::start(h, o.data(), lse.data(), B, Tl, H, hd);
      for (auto [kv, kp] : {std::pair{mine.data(), qpos}, std::pair{const_cast<double*>(ot.data()), kother},
                            std::pair{const_cast<double*>(lt.data()), klater}})
        Ref::forward(h, o.data(), lse.data(), q.data(), kv, B, Tl, H, hd, g, qpos, kp, hm);
      Ref::finish(h, out.data(), o.data(), static_cast<std::int64_t>(no));
      CHECK(rel_error(gmine.get(d), mine) == 0);  // a copy
      CHECK(rel_error(go.get(d), o) <= 1e-5);
      CHECK(rel_error(glse.get(d), lse) <= 1e-5);
      CHECK(rel_error(gout.get(d), out) <= tolerance<T>(8e-3));
      // The backward from the GPU's own output (as the layer runs it), against the host's from the
      // same output widened.
      const V gout_d = widen(gout.get(d));
      Ref::row_dots(h, D.data(), dy.data(), gout_d.data(), B, Tl, H, hd);
      CHECK(rel_error(gD.get(d), D) <= 1e-5);
      std::vector<V> dkv;
      int k = 0;
      for (auto [kv, kp] :
           {std::pair{gmine.data(), qpos}, std::pair{gother.data(), kother}, std::pair{glater.data(), klater}}) {
        DeviceVec<float> gd(d, std::vector<float>(nkv, 0.f));
        Gpu::backward(d, gdq.data(), gd.data(), gq.data(), kv, gdout.data(), gD.data(), glse.data(), B, Tl, H, hd, g,
                      qpos, kp, gm);
        const V& hkv = k == 0 ? mine : k == 1 ? ot : lt;
        V r(nkv, 0.0);
        Ref::backward(h, dq.data(), r.data(), q.data(), hkv.data(), dy.data(), D.data(), lse.data(), B, Tl, H, hd, g,
                      qpos,
                      k == 0   ? qpos
                      : k == 1 ? kother
                               : klater,
                      hm);
        CHECK(rel_error(gd.get(d), r) <= 1e-5);
        if (k == 0) {
          Gpu::write_dqkv(d, gdqkv.data(), gdq.data(), gd.data(), B, Tl, H, hd, g);  // after the own block: dq so far
          V dqkv(nq);
          Ref::write_dqkv(h, dqkv.data(), dq.data(), r.data(), B, Tl, H, hd, g);
          CHECK(rel_error(gdqkv.get(d), dqkv) <= tolerance<T>(8e-3));
        }
        dkv.push_back(r);
        ++k;
      }
      CHECK(rel_error(gdq.get(d), dq) <= 1e-5);
      // The block after the queries' first chunk still reaches their second chunk: not zero.
      double later_grad = 0;
      for (double x : dkv[2]) later_grad = std::max(later_grad, std::fabs(x));
      CHECK(later_grad > 0);
    }
}

TEST_CASE("context attention blocks refuse sizes that do not fit, naming them") {
  Cuda& d = gpu();
  DeviceVec<float> a(d, 64), b(d, 64);
  CHECK_THROWS_WITH_AS(ops::ContextBlock<Cuda>::pack_kv(d, a.data(), b.data(), 1, 2, 3, 4, 2),
                       doctest::Contains("3 heads in groups of 2"), Error);
}

TEST_CASE_TEMPLATE(
    "context attention on thread ranks sharing the GPU equals the host's: ring and all-gather, context 2 and 4", A,
    context::Ring, context::AllGather) {
  (void)gpu();  // skips where there is no GPU
  const std::int64_t B = 2, T_ = 48, H = 4, g = 2, hd = 16, row = (H / g) * (g + 2) * hd;
  for (int c : {2, 4}) {
    CAPTURE(c);
    const auto ch = context::Chunks::of(T_, c);
    const std::int64_t Tl = ch.local();
    const auto nq = static_cast<std::size_t>(B * Tl * row), no = static_cast<std::size_t>(B * Tl * H * hd),
               nr = static_cast<std::size_t>(B * H * Tl);
    std::vector<double> err_y(static_cast<std::size_t>(c)), err_dx(static_cast<std::size_t>(c));
    std::vector<V> y(static_cast<std::size_t>(c)), dx(static_cast<std::size_t>(c));
    const auto inputs = [&](int r) {
      return std::pair{random<float>(nq, 40 + static_cast<std::uint64_t>(r)),
                       random<float>(no, 50 + static_cast<std::uint64_t>(r))};
    };
    run_threads(c, [&](ThreadComm& world) {  // the host's, in double
      const auto r = static_cast<std::size_t>(world.rank());
      const auto [x, dy] = inputs(world.rank());
      const V xd = widen(x), dyd = widen(dy);
      V lse(nr);
      y[r].resize(no);
      dx[r].resize(nq);
      A::forward(world, ch, y[r].data(), lse.data(), xd.data(), B, Tl, H, hd, g);
      A::backward(world, ch, dx[r].data(), dyd.data(), y[r].data(), lse.data(), xd.data(), B, Tl, H, hd, g);
    });
    run_threads(c, [&](ThreadComm& world) {  // the GPU's: each rank its own device object (stream)
      const auto r = static_cast<std::size_t>(world.rank());
      const auto [x, dy] = inputs(world.rank());
      Cuda dev(0);
      world.set_memory(std::make_shared<threads::CudaMemory>(dev));  // the blocks move between device buffers
      DeviceVec<float> gx(dev, x), gdy(dev, dy), gy(dev, no), gdx(dev, nq), glse(dev, nr);
      {
        nn::detail::DeviceBuffers<Cuda> w(dev);
        A::forward(world, ch, gy.data(), glse.data(), gx.data(), B, Tl, H, hd, g, {}, w);
      }
      {
        nn::detail::DeviceBuffers<Cuda> w(dev);
        A::backward(world, ch, gdx.data(), gdy.data(), gy.data(), glse.data(), gx.data(), B, Tl, H, hd, g, {}, w);
      }
      err_y[r] = rel_error(gy.get(dev), y[r]);
      err_dx[r] = rel_error(gdx.get(dev), dx[r]);
    });
    for (int r = 0; r < c; ++r) {
      INFO(std::string(A::name), " rank ", r);
      CHECK(err_y[static_cast<std::size_t>(r)] <= 1e-5);  // float sums against double
      CHECK(err_dx[static_cast<std::size_t>(r)] <= 1e-5);
    }
  }
}

TEST_CASE_TEMPLATE(
    "a grouped-query attention layer with the sequence over context 2 on the GPU equals the host's whole sequence", A,
    context::Ring, context::AllGather) {
  (void)gpu();
  constexpr std::int64_t B = 2, T_ = 16, C = 32, H = 4, KV = 2;
  const ops::Rope rope{
      .theta = 500, .factor = 4, .low_freq_factor = 1, .high_freq_factor = 4, .original_max_positions = 8};
  const V x = widen(random<float>(static_cast<std::size_t>(B * T_ * C), 61)),
          dy = widen(random<float>(static_cast<std::size_t>(B * T_ * C), 62));
  // The host's layer over the whole sequence, in double.
  Host h;
  nn::GroupedQueryAttention<double> ref(h, C, H, KV, rope, Spread{}, 1, 3, 0.3, 0.3);
  auto hx = Tensor<double, nn::act::Full, Host>::empty(h, {B, T_, C}, Spread{});
  auto hdy = Tensor<double, nn::act::Full, Host>::empty(h, {B, T_, C}, Spread{});
  std::copy(x.begin(), x.end(), hx.data());
  std::copy(dy.begin(), dy.end(), hdy.data());
  typename decltype(ref)::Ctx rctx;
  const auto ry = ref.forward(rctx, hx).to_host(), rdx = ref.backward(rctx, hdy).to_host();
  std::map<std::string, V> rgrads;
  ref.for_each_param("attn", [&](const std::string& n, auto& p) { rgrads[n] = p.grad.to_host(); });
  // The rows of a (B, T, C) array at context rank r's positions.
  const auto ch = context::Chunks::of(T_, 2);
  const auto rows = [&](const V& full, int r) {
    std::vector<float> out(static_cast<std::size_t>(B * ch.local() * C));
    for (std::int64_t b = 0; b < B; ++b)
      for (std::int64_t t = 0; t < ch.local(); ++t)
        for (std::int64_t k = 0; k < C; ++k)
          out[static_cast<std::size_t>((b * ch.local() + t) * C + k)] =
              static_cast<float>(full[static_cast<std::size_t>((b * T_ + ch.position(r, t)) * C + k)]);
    return out;
  };
  std::vector<double> err(2 * 3);
  run_threads(2, [&](ThreadComm& world) {
    Cuda dev(0);
    world.set_memory(std::make_shared<threads::CudaMemory>(dev));
    Mesh mesh{world, {.context = 2}};
    const Spread s = mesh.spread();
    const int r = s.context_index;
    using Attn = nn::GroupedQueryAttention<float, recompute::None, Cuda, A>;
    Attn attn(dev, C, H, KV, rope, s, 1, 3, 0.3, 0.3);
    auto gx = Tensor<float, typename Attn::In, Cuda>::empty(dev, {B, T_, C}, s);
    auto gdy = Tensor<float, typename Attn::GradOut, Cuda>::empty(dev, {B, T_, C}, s);
    const auto xr = rows(x, r), dyr = rows(dy, r);
    dev.from_host(gx.data(), xr.data(), xr.size() * sizeof(float));
    dev.from_host(gdy.data(), dyr.data(), dyr.size() * sizeof(float));
    typename Attn::Ctx ctx;
    const auto y = attn.forward(ctx, gx, mesh).to_host();
    const auto dx = attn.backward(ctx, gdy, mesh).to_host();
    // against want's rows, relative to its largest
    const auto err_of = [&](const std::vector<float>& got, const V& want) {
      const auto mine = rows(want, r);
      double e = 0, m = 0;
      for (std::size_t i = 0; i < got.size(); ++i) e = test::worse(e, std::fabs(double(got[i]) - double(mine[i])));
      for (double v : want) m = std::max(m, std::fabs(v));
      return e / m;
    };
    err[static_cast<std::size_t>(3 * r)] = err_of(y, ry);
    err[static_cast<std::size_t>(3 * r + 1)] = err_of(dx, rdx);
    double g = 0;
    attn.for_each_param("attn", [&](const std::string& n, auto& p) {  // each rank's rows' sum; the context group's sum
      mesh.context().all_reduce(p.grad.span(), ReduceOp::sum);
      const auto got = p.grad.to_host();
      const V& want = rgrads.at(n);
      double e = 0, m = 0;
      for (std::size_t i = 0; i < got.size(); ++i) e = test::worse(e, std::fabs(double(got[i]) - want[i]));
      for (double v : want) m = std::max(m, std::fabs(v));
      g = test::worse(g, e / m);
    });
    err[static_cast<std::size_t>(3 * r + 2)] = g;
  });
  // f32 on the GPU against double: 1e-5 of the largest element (y, dx; x rounded to f32 once, as the
  // host's input is that rounding widened).
  for (std::size_t i = 0; i < err.size(); ++i) {
    INFO(std::string(A::name), " rank ", i / 3, " ", i % 3 == 0 ? "y" : i % 3 == 1 ? "dx" : "weight gradients");
    CHECK(err[i] <= 1e-5);
  }
}
