// The Llama family's CUDA ops (RMSNorm, rotary, SwiGLU: ops/rmsnorm.cuh, ops/rotary.cuh, ops/swiglu.cuh) against the
// host ops in double on random inputs, at sizes that are not multiples of a warp or a block.
// Tolerances as in ops.cu: f32 1e-5 relative to the largest reference element; bf16 per op.
#include <doctest/doctest.h>

#include "support.cuh"
#include "weft/ops/rmsnorm.cuh"
#include "weft/ops/rmsnorm.hpp"
#include "weft/ops/rotary.cuh"
#include "weft/ops/swiglu.cuh"
#include "weft/ops/swiglu.hpp"

using namespace weft;
using namespace weft::test;
using V = std::vector<double>;

TEST_CASE_TEMPLATE("rmsnorm forward and backward (with the residual gradient)", T, float, bf16) {
  Cuda& d = gpu();
  Host h;
  for (auto [N, C] : {std::pair<std::int64_t, std::int64_t>{1, 32}, {7, 100}, {257, 768}}) {
    CAPTURE(N);
    CAPTURE(C);
    const auto x = random<T>(static_cast<std::size_t>(N * C), 3, 2.0), w = random<T>(static_cast<std::size_t>(C), 5);
    const auto dy = random<T>(static_cast<std::size_t>(N * C), 7), res = random<T>(static_cast<std::size_t>(N * C), 8);
    DeviceVec<T> gx(d, x), gw(d, w), gdy(d, dy), gres(d, res), y(d, x.size()), dx(d, x.size());
    DeviceVec<float> rstd(d, static_cast<std::size_t>(N));
    DeviceVec<float> dw(d, std::vector<float>(static_cast<std::size_t>(C), 0.5f));
    weft::cuda::rmsnorm_forward(d, y.data(), rstd.data(), gx.data(), gw.data(), N, C, 1e-5f);
    weft::cuda::rmsnorm_backward(d, dx.data(), dw.data(), gdy.data(), gx.data(), gw.data(), rstd.data(), N, C,
                                 gres.data());
    const V xd = widen(x), wd = widen(w), dyd = widen(dy), rd = widen(res);
    V ry(x.size()), rr(static_cast<std::size_t>(N)), rdx(x.size()), rdw(static_cast<std::size_t>(C), 0.5);
    ops::RmsNorm<Host>::forward(h, ry.data(), rr.data(), xd.data(), wd.data(), N, C, 1e-5);
    ops::RmsNorm<Host>::backward(h, rdx.data(), rdw.data(), dyd.data(), xd.data(), wd.data(), rr.data(), N, C,
                                 rd.data());
    CHECK(rel_error(y.get(d), ry) <= tolerance<T>(8e-3));  // bf16: one rounding of the output
    CHECK(rel_error(rstd.get(d), rr) <= 1e-5);
    CHECK(rel_error(dx.get(d), rdx) <= tolerance<T>(8e-3));
    CHECK(rel_error(dw.get(d), rdw) <= 1e-4);  // float sums over up to 257 rows, in another order
  }
}

TEST_CASE_TEMPLATE("rotary forward and backward over grouped queries and keys", T, float, bf16) {
  Cuda& d = gpu();
  Host h;
  const ops::Rope rope{
      .theta = 500000, .factor = 8, .low_freq_factor = 1, .high_freq_factor = 4, .original_max_positions = 64};
  for (auto [B, Tn, G, g, hd] :
       {std::tuple<std::int64_t, std::int64_t, std::int64_t, std::int64_t, std::int64_t>{1, 5, 1, 1, 2},
        {2, 37, 2, 4, 64},
        {3, 130, 1, 8, 128}}) {
    const std::size_t n = static_cast<std::size_t>(B * Tn * G * (g + 2) * hd);
    const auto x = random<T>(n, 9);
    // From position 3, and as a context rank's two chunks (the second half of the rows from 200).
    for (const ops::Positions pos : {ops::Positions(3), ops::Positions(Tn / 2, Tn / 2, 200)}) {
      DeviceVec<T> gx(d, x);
      weft::cuda::rotary(d, gx.data(), B, Tn, G, g, hd, rope, pos, 1.0);
      V r = widen(x);
      ops::Rotary<Host>::forward(h, r.data(), B, Tn, G, g, hd, rope, pos);
      CHECK(rel_error(gx.get(d), r) <= tolerance<T>(8e-3));
      weft::cuda::rotary(d, gx.data(), B, Tn, G, g, hd, rope, pos, -1.0);  // back to the input
      CHECK(rel_error(gx.get(d), widen(x)) <= tolerance<T>(1.6e-2));       // bf16: two roundings
    }
  }
  DeviceVec<T> big(d, random<T>(3 * 514, 10));  // one token, a group of one query: a head of 514, over the kernel's 512
  CHECK_THROWS_WITH_AS(weft::cuda::rotary(d, big.data(), 1, 1, 1, 1, 514, rope, 0, 1.0),
                       doctest::Contains("head size 514 is over 512"), weft::Error);
}

TEST_CASE_TEMPLATE("swiglu forward and backward", T, float, bf16) {
  Cuda& d = gpu();
  Host h;
  for (std::int64_t n : {1, 1000, (1 << 20) + 3}) {
    const auto a = random<T>(static_cast<std::size_t>(2 * n), 1, 2.0), dy = random<T>(static_cast<std::size_t>(n), 2);
    DeviceVec<T> ga(d, a), gdy(d, dy), y(d, static_cast<std::size_t>(n)), da(d, a.size());
    weft::cuda::swiglu_forward(d, y.data(), ga.data(), n);
    weft::cuda::swiglu_backward(d, da.data(), ga.data(), gdy.data(), n);
    const V ad = widen(a), dyd = widen(dy);
    V ry(static_cast<std::size_t>(n)), rda(a.size());
    ops::SwiGlu<Host>::forward(h, ry.data(), ad.data(), n);
    ops::SwiGlu<Host>::backward(h, rda.data(), ad.data(), dyd.data(), n);
    CHECK(rel_error(y.get(d), ry) <= tolerance<T>(8e-3));
    CHECK(rel_error(da.get(d), rda) <= tolerance<T>(8e-3));
  }
}
