// Every CUDA op against the host op on fresh random inputs, at several sizes including ones that
// are not multiples of any block or tile size, with outputs poisoned before each run.
// Tolerances: f32 1e-5 relative (to the largest reference element); bf16 per op, stated beside it.
#include <doctest/doctest.h>

#include <cmath>
#include <tuple>

#include "support.cuh"
#include "weft/ops/all.hpp"
#include "weft/ops/bias.cuh"
#include "weft/ops/cross_entropy.cuh"
#include "weft/ops/embedding.cuh"
#include "weft/ops/gelu.cuh"
#include "weft/ops/layernorm.cuh"
#include "weft/ops/memory.cuh"
#include "weft/ops/modulate.cuh"
#include "weft/ops/silu.cuh"
#include "weft/ops/squared_error.cuh"
#include "weft/ops/update.cuh"

using namespace weft;
using namespace weft::test;
using V = std::vector<double>;

TEST_CASE("Cuda device: a clear Error where there is no GPU and accounting where there is one") {
  if (weft::cuda::probe().absent) {
    CHECK_THROWS_WITH_AS(Cuda(),
                         "Cuda: no CUDA device is visible (no GPU, or no driver); run on a machine with an "
                         "NVIDIA GPU, or use the Host device",
                         Error);
    return;
  }
  Cuda& d = gpu();
  const auto before = d.memory().current_of(Category::activations);
  {
    Allocation a = d.allocate(1000, Category::activations);
    CHECK(d.memory().current_of(Category::activations) == before + 1000);
    CHECK(reinterpret_cast<std::uintptr_t>(a.data()) % 256 == 0);
  }
  CHECK(d.memory().current_of(Category::activations) == before);
  CHECK_THROWS_WITH_AS(Cuda(1 << 20), doctest::Contains("device 1048576 requested"), Error);
}

TEST_CASE_TEMPLATE("gelu forward and backward", T, float, bf16) {
  Cuda& d = gpu();
  for (std::int64_t n : {1, 1000, 4099, (1 << 20) + 3}) {
    const auto x = random<T>(static_cast<std::size_t>(n), 1, 2.0), dout = random<T>(static_cast<std::size_t>(n), 2);
    DeviceVec<T> dx_(d, x), ddout(d, dout), out(d, x.size()), dx(d, x.size());
    weft::cuda::gelu_forward(d, out.data(), dx_.data(), n);
    weft::cuda::gelu_backward(d, dx.data(), dx_.data(), ddout.data(), n);
    V ref_out(x.size()), ref_dx(x.size());
    const V xd = widen(x), dd = widen(dout);
    host::gelu_forward(ref_out.data(), xd.data(), n);
    host::gelu_backward(ref_dx.data(), xd.data(), dd.data(), n);
    CHECK(rel_error(out.get(d), ref_out) <= tolerance<T>(4e-3));  // bf16: one rounding, 2^-8
    CHECK(rel_error(dx.get(d), ref_dx) <= tolerance<T>(4e-3));
    if (n < 2) continue;
    // Buffers that are not 16-byte aligned take the scalar kernel: one element in, n - 1 long.
    weft::cuda::gelu_forward(d, out.data() + 1, dx_.data() + 1, n - 1);
    weft::cuda::gelu_backward(d, dx.data() + 1, dx_.data() + 1, ddout.data() + 1, n - 1);
    const auto out2 = out.get(d), dx2 = dx.get(d);
    CHECK(rel_error(std::vector<T>(out2.begin() + 1, out2.end()), V(ref_out.begin() + 1, ref_out.end())) <=
          tolerance<T>(4e-3));
    CHECK(rel_error(std::vector<T>(dx2.begin() + 1, dx2.end()), V(ref_dx.begin() + 1, ref_dx.end())) <=
          tolerance<T>(4e-3));
  }
}

TEST_CASE_TEMPLATE("silu forward and backward against the host, aligned and not", T, float, bf16) {
  Cuda& d = gpu();
  for (std::int64_t n : {1, 1000, 4099, 70001}) {
    const auto x = random<T>(static_cast<std::size_t>(n), 81, 4.0), dout = random<T>(static_cast<std::size_t>(n), 82);
    DeviceVec<T> gx(d, x), gd(d, dout), out(d, x.size()), dx(d, x.size());
    ops::Silu<Cuda>::forward(d, out.data(), gx.data(), n);
    ops::Silu<Cuda>::backward(d, dx.data(), gx.data(), gd.data(), n);
    V ref_out(x.size()), ref_dx(x.size());
    const V xd = widen(x), dd = widen(dout);
    host::silu_forward(ref_out.data(), xd.data(), n);
    host::silu_backward(ref_dx.data(), xd.data(), dd.data(), n);
    CHECK(rel_error(out.get(d), ref_out) <= tolerance<T>(4e-3));  // f32: expf's ulps; bf16: one rounding, 2^-8
    CHECK(rel_error(dx.get(d), ref_dx) <= tolerance<T>(4e-3));
    if (n < 2) continue;
    ops::Silu<Cuda>::forward(d, out.data() + 1, gx.data() + 1, n - 1);  // the scalar kernel
    const auto o = out.get(d);
    CHECK(rel_error(std::vector<T>(o.begin() + 1, o.end()), V(ref_out.begin() + 1, ref_out.end())) <=
          tolerance<T>(4e-3));
  }
}

TEST_CASE_TEMPLATE("modulation and gate (per-sample shift, scale and gate) forward and backward against the host", T,
                   float, bf16) {
  Cuda& d = gpu();
  for (auto [B, Tl, C] : {std::tuple<std::int64_t, std::int64_t, std::int64_t>{1, 1, 1}, {2, 33, 48}, {3, 257, 64}}) {
    CAPTURE(Tl);
    const auto nx = static_cast<std::size_t>(B * Tl * C), nm = static_cast<std::size_t>(B * 2 * C);
    const auto x = random<T>(nx, 61), mod = random<T>(nm, 62, 0.5), dy = random<T>(nx, 63);
    DeviceVec<T> gx(d, x), gmod(d, mod), gdy(d, dy), gy(d, nx), gdx(d, nx), gdmod(d, nm);
    ops::Modulate<Cuda>::forward(d, gy.data(), gx.data(), gmod.data(), B, Tl, C);
    ops::Modulate<Cuda>::backward(d, gdx.data(), gdmod.data(), gdy.data(), gx.data(), gmod.data(), B, Tl, C);
    const V xd = widen(x), md = widen(mod), dyd = widen(dy);
    V y(nx), dx(nx), dmod(nm);
    host::modulate_forward(y.data(), xd.data(), md.data(), B, Tl, C);
    host::modulate_backward(dx.data(), dmod.data(), dyd.data(), xd.data(), md.data(), B, Tl, C);
    // f32: one multiply-add, and sums over up to 257 rows in another order (1e-5). bf16: the
    // output rounded once (2^-8), the sums' (written in bf16) too: 8e-3.
    CHECK(rel_error(gy.get(d), y) <= tolerance<T>(8e-3));
    CHECK(rel_error(gdx.get(d), dx) <= tolerance<T>(8e-3));
    CHECK(rel_error(gdmod.get(d), dmod) <= tolerance<T>(8e-3));
    // The gate: y = x gate, per sample (the first C of mod as the gate).
    DeviceVec<T> gg(d, std::vector<T>(mod.begin(), mod.begin() + static_cast<std::ptrdiff_t>(B * C)));
    ops::Modulate<Cuda>::gate(d, gy.data(), gx.data(), gg.data(), B, Tl, C);
    ops::Modulate<Cuda>::gate_backward(d, gdx.data(), gdmod.data(), gdy.data(), gx.data(), gg.data(), B, Tl, C);
    const V gd(md.begin(), md.begin() + static_cast<std::ptrdiff_t>(B * C));
    V dgate(static_cast<std::size_t>(B * C));
    host::gate_forward(y.data(), xd.data(), gd.data(), B, Tl, C);
    host::gate_backward(dx.data(), dgate.data(), dyd.data(), xd.data(), gd.data(), B, Tl, C);
    CHECK(rel_error(gy.get(d), y) <= tolerance<T>(8e-3));
    CHECK(rel_error(gdx.get(d), dx) <= tolerance<T>(8e-3));
    const auto got_dgate = gdmod.get(d);
    CHECK(rel_error(std::vector<T>(got_dgate.begin(), got_dgate.begin() + static_cast<std::ptrdiff_t>(B * C)), dgate) <=
          tolerance<T>(8e-3));
  }
}

TEST_CASE_TEMPLATE("squared error: the sum and the gradient against the host", T, float, bf16) {
  Cuda& d = gpu();
  for (std::int64_t n : {1, 1000, 70001}) {
    const auto pred = random<T>(static_cast<std::size_t>(n), 71), target = random<T>(static_cast<std::size_t>(n), 72);
    DeviceVec<T> gp(d, pred), gt(d, target), gdp(d, static_cast<std::size_t>(n));
    const double sum = ops::SquaredError<Cuda>::sum(d, gp.data(), gt.data(), n);
    ops::SquaredError<Cuda>::backward(d, gdp.data(), gp.data(), gt.data(), n, 0.5f);
    const V pd = widen(pred), td = widen(target);
    V dp(pd.size());
    const double want = host::squared_error_sum(pd.data(), td.data(), n);
    host::squared_error_backward(dp.data(), pd.data(), td.data(), n, 0.5);
    // The sum in double from float differences (exact from bf16 inputs): 1e-6 relative.
    CHECK(std::abs(sum - want) <= 1e-6 * want);
    CHECK(rel_error(gdp.get(d), dp) <= tolerance<T>(4e-3));
  }
}

TEST_CASE_TEMPLATE("layernorm forward (with and without the fused residual) and backward", T, float, bf16) {
  Cuda& d = gpu();
  for (auto [N, C] : {std::pair<std::int64_t, std::int64_t>{1, 32}, {7, 100}, {257, 768}, {64, 1600}}) {
    CAPTURE(N);
    CAPTURE(C);
    const auto x = random<T>(static_cast<std::size_t>(N * C), 3, 2.0),
               res = random<T>(static_cast<std::size_t>(N * C), 4);
    const auto w = random<T>(static_cast<std::size_t>(C), 5), b = random<T>(static_cast<std::size_t>(C), 6);
    const auto dout = random<T>(static_cast<std::size_t>(N * C), 7);
    DeviceVec<T> gx(d, x), gres(d, res), gw(d, w), gb(d, b), gdout(d, dout), out(d, x.size()), rout(d, x.size()),
        dx(d, x.size());
    DeviceVec<float> mean(d, static_cast<std::size_t>(N)), rstd(d, static_cast<std::size_t>(N));
    std::vector<T> zero(static_cast<std::size_t>(C), from_double<T>(0.0));
    DeviceVec<T> dw(d, zero), db(d, zero);

    // Fused: r = x + res, out = LN(r).
    weft::cuda::layernorm_forward(d, out.data(), mean.data(), rstd.data(), gx.data(), gw.data(), gb.data(), N, C, 1e-5f,
                                  rout.data(), gres.data());
    V r(x.size()), ref_out(x.size()), ref_mean(static_cast<std::size_t>(N)), ref_rstd(static_cast<std::size_t>(N));
    for (std::size_t i = 0; i < x.size(); ++i) r[i] = to_double(x[i]) + to_double(res[i]);
    const V wd = widen(w), bd = widen(b);
    host::layernorm_forward(ref_out.data(), ref_mean.data(), ref_rstd.data(), r.data(), wd.data(), bd.data(), N, C,
                            1e-5);
    CHECK(rel_error(rout.get(d), r) <= tolerance<T>(4e-3));
    CHECK(rel_error(out.get(d), ref_out) <= tolerance<T>(1e-2));  // bf16: the sum rounds once, then 2 ops in float
    CHECK(rel_error(mean.get(d), ref_mean) <= tolerance<T>(1e-2));

    // Plain forward on x, then backward against the host in double.
    weft::cuda::layernorm_forward(d, out.data(), mean.data(), rstd.data(), gx.data(), gw.data(), gb.data(), N, C,
                                  1e-5f);
    const V xd = widen(x);
    host::layernorm_forward(ref_out.data(), ref_mean.data(), ref_rstd.data(), xd.data(), wd.data(), bd.data(), N, C,
                            1e-5);
    CHECK(rel_error(out.get(d), ref_out) <= tolerance<T>(1e-2));
    weft::cuda::layernorm_backward(d, dx.data(), dw.data(), db.data(), gdout.data(), gx.data(), gw.data(), mean.data(),
                                   rstd.data(), N, C);
    V ref_dx(x.size()), ref_dw(static_cast<std::size_t>(C), 0.0), ref_db(static_cast<std::size_t>(C), 0.0);
    const V dd = widen(dout);
    host::layernorm_backward(ref_dx.data(), ref_dw.data(), ref_db.data(), dd.data(), xd.data(), wd.data(),
                             ref_mean.data(), ref_rstd.data(), N, C);
    CHECK(rel_error(dx.get(d), ref_dx) <= tolerance<T>(1e-2));
    CHECK(rel_error(dw.get(d), ref_dw) <= tolerance<T>(1e-2));
    CHECK(rel_error(db.get(d), ref_db) <= tolerance<T>(1e-2));
  }
}

TEST_CASE("layernorm and embedding backward are bitwise repeatable") {
  Cuda& d = gpu();
  const std::int64_t N = 4096, C = 768;
  const auto x = random<float>(static_cast<std::size_t>(N * C), 8),
             dout = random<float>(static_cast<std::size_t>(N * C), 9);
  const auto w = random<float>(static_cast<std::size_t>(C), 10), b = random<float>(static_cast<std::size_t>(C), 11);
  DeviceVec<float> gx(d, x), gdout(d, dout), gw(d, w), gb(d, b), out(d, x.size()), dx(d, x.size()), mean(d, N),
      rstd(d, N);
  weft::cuda::layernorm_forward(d, out.data(), mean.data(), rstd.data(), gx.data(), gw.data(), gb.data(), N, C, 1e-5f);
  std::vector<std::vector<float>> dws;
  std::vector<std::int32_t> tokens(static_cast<std::size_t>(N));
  for (std::size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<std::int32_t>(weft::philox(3, 3, i)[0] % 50);
  DeviceVec<std::int32_t> gt(d, tokens);
  std::vector<std::vector<float>> tables;
  for (int run = 0; run < 2; ++run) {
    DeviceVec<float> dw(d, std::vector<float>(static_cast<std::size_t>(C), 0.0f)),
        db(d, std::vector<float>(static_cast<std::size_t>(C), 0.0f)),
        table(d, std::vector<float>(static_cast<std::size_t>(50 * C), 0.0f));
    weft::cuda::layernorm_backward(d, dx.data(), dw.data(), db.data(), gdout.data(), gx.data(), gw.data(), mean.data(),
                                   rstd.data(), N, C);
    weft::cuda::embedding_backward(d, table.data(), gdout.data(), gt.data(), N, C, 0, 50);
    dws.push_back(dw.get(d));
    tables.push_back(table.get(d));
  }
  CHECK(std::memcmp(dws[0].data(), dws[1].data(), dws[0].size() * sizeof(float)) == 0);
  CHECK(std::memcmp(tables[0].data(), tables[1].data(), tables[0].size() * sizeof(float)) == 0);
}

TEST_CASE_TEMPLATE("vocab-parallel embedding forward and backward", T, float, bf16) {
  Cuda& d = gpu();
  const std::int64_t begin = 30, end = 70;  // this rank's rows of a vocabulary of 100
  // 50: scalar path
  for (auto [N, C] : {std::pair<std::int64_t, std::int64_t>{1, 96}, {100, 96}, {5000, 96}, {300, 50}}) {
    std::vector<std::int32_t> tokens(static_cast<std::size_t>(N));
    for (std::size_t i = 0; i < tokens.size(); ++i)
      tokens[i] = static_cast<std::int32_t>(weft::philox(5, 1, i)[0] % 100);
    const auto table = random<T>(static_cast<std::size_t>((end - begin) * C), 12);
    const auto dout = random<T>(static_cast<std::size_t>(N * C), 13);
    const auto start = random<T>(table.size(), 14);  // dtable accumulates onto this
    DeviceVec<std::int32_t> gt(d, tokens);
    DeviceVec<T> gtable(d, table), gdout(d, dout), out(d, static_cast<std::size_t>(N * C)), dtable(d, start);
    weft::cuda::embedding_forward(d, out.data(), gt.data(), gtable.data(), N, C, begin, end);
    weft::cuda::embedding_backward(d, dtable.data(), gdout.data(), gt.data(), N, C, begin, end);
    V ref_out(static_cast<std::size_t>(N * C)), ref_dtable = widen(start);
    const V td = widen(table), dd = widen(dout);
    host::embedding_forward(ref_out.data(), tokens.data(), td.data(), N, C, begin, end);
    host::embedding_backward(ref_dtable.data(), dd.data(), tokens.data(), N, C, begin, end);
    CHECK(rel_error(out.get(d), ref_out) == 0.0);                       // a copy
    CHECK(rel_error(dtable.get(d), ref_dtable) <= tolerance<T>(1e-2));  // bf16: one rounding of a float sum
  }
}

TEST_CASE_TEMPLATE("learned positions forward and backward: one run of positions, and a context rank's two chunks", T,
                   float, bf16) {
  Cuda& d = gpu();
  const std::int64_t B = 3, Tl = 24, C = 40, P = 96;  // a table of 96 positions
  // t0 = 10 (a sequence-parallel slice), and context::Chunks::of(96, 4).positions(1): chunks 1 and 6 of 8.
  for (const ops::Positions pos : {ops::Positions(10), ops::Positions(12, 12, 72)}) {
    CAPTURE(pos.p0);
    const auto x = random<T>(static_cast<std::size_t>(B * Tl * C), 15),
               table = random<T>(static_cast<std::size_t>(P * C), 16);
    const auto dy = random<T>(x.size(), 17);
    const auto start = random<float>(table.size(), 18);  // dtable accumulates onto this
    DeviceVec<T> gx(d, x), gtable(d, table), gdy(d, dy);
    DeviceVec<float> dtable(d, start);
    weft::cuda::position_forward(d, gx.data(), gtable.data(), B, Tl, C, pos);
    weft::cuda::position_backward(d, dtable.data(), gdy.data(), B, Tl, C, pos);
    V rx = widen(x), rdt = widen(start);
    const V td = widen(table), dd = widen(dy);
    host::position_forward(rx.data(), td.data(), B, Tl, C, pos);
    host::position_backward(rdt.data(), dd.data(), B, Tl, C, pos);
    CHECK(rel_error(gx.get(d), rx) <= tolerance<T>(8e-3));  // bf16: one rounding of the sum
    CHECK(rel_error(dtable.get(d), rdt) <= 1e-5);           // float sums of 3 rows
  }
}

TEST_CASE_TEMPLATE("vocab-parallel cross-entropy: row statistics and the in-place gradient", T, float, bf16) {
  Cuda& d = gpu();
  for (auto [N, Vn] : {std::pair<std::int64_t, std::int64_t>{1, 10}, {17, 1000}, {64, 12576}}) {
    const std::int64_t valid = Vn - 3, begin = 1000;  // 3 padded columns; this shard starts at vocab id 1000
    const auto logits = random<T>(static_cast<std::size_t>(N * Vn), 15, 3.0);
    std::vector<std::int32_t> targets(static_cast<std::size_t>(N));
    for (std::size_t i = 0; i < targets.size(); ++i)  // some targets here, some in other shards
      targets[i] = static_cast<std::int32_t>(begin - 5 + weft::philox(6, 1, i)[0] % (valid + 10));
    DeviceVec<T> gl(d, logits);
    DeviceVec<std::int32_t> gt(d, targets);
    DeviceVec<float> rowmax(d, static_cast<std::size_t>(N)), stats(d, static_cast<std::size_t>(2 * N));
    weft::cuda::ce_row_max(d, rowmax.data(), gl.data(), N, Vn, valid);
    weft::cuda::ce_row_stats(d, stats.data(), gl.data(), rowmax.data(), gt.data(), N, Vn, valid, begin);
    const V ld = widen(logits);
    V ref_max(static_cast<std::size_t>(N)), ref_stats(static_cast<std::size_t>(2 * N));
    host::ce_row_max(ref_max.data(), ld.data(), N, Vn, valid);
    host::ce_row_stats(ref_stats.data(), ld.data(), ref_max.data(), targets.data(), N, Vn, valid, begin);
    CHECK(rel_error(rowmax.get(d), ref_max) == 0.0);    // a max of the same values
    CHECK(rel_error(stats.get(d), ref_stats) <= 1e-5);  // float sums of exp in another order
    // Backward in place over the logits.
    V ref_sumexp(static_cast<std::size_t>(N)), ref_dl(ld.size());
    for (std::int64_t n = 0; n < N; ++n)
      ref_sumexp[static_cast<std::size_t>(n)] = ref_stats[static_cast<std::size_t>(2 * n)];
    host::ce_backward(ref_dl.data(), ld.data(), ref_max.data(), ref_sumexp.data(), targets.data(), N, Vn, valid, begin,
                      1.0 / static_cast<double>(N));
    weft::cuda::ce_backward(d, gl.data(), rowmax.data(), stats.data(), gt.data(), N, Vn, valid, begin,
                            1.0f / static_cast<float>(N));
    CHECK(rel_error(gl.get(d), ref_dl) <= tolerance<T>(1e-2));  // bf16: the gradient rounds once
  }
}

TEST_CASE("multi-tensor AdamW and the global gradient norm") {
  Cuda& d = gpu();
  const std::vector<std::int64_t> sizes{5, 70000, 200001};
  const math::AdamW a{.lr = 1e-3f,
                      .beta1 = 0.9f,
                      .beta2 = 0.95f,
                      .eps = 1e-8f,
                      .weight_decay = 0.1f,
                      .bc1 = 1 - 0.9f * 0.9f,
                      .bc2 = 1 - 0.95f * 0.95f};  // step 2
  std::vector<std::vector<float>> p, g, m, v;
  std::vector<DeviceVec<float>> gp, gg, gm, gv;
  std::vector<weft::cuda::TensorRef> refs;
  for (std::size_t t = 0; t < sizes.size(); ++t) {
    const auto n = static_cast<std::size_t>(sizes[t]);
    p.push_back(random<float>(n, 20 + t));
    g.push_back(random<float>(n, 30 + t));
    m.push_back(random<float>(n, 40 + t, 0.1));
    auto vv = random<float>(n, 50 + t, 0.1);
    for (float& x : vv) x = x * x;  // second moments are non-negative
    v.push_back(vv);
  }
  for (std::size_t t = 0; t < sizes.size(); ++t) {
    gp.emplace_back(d, p[t]);
    gg.emplace_back(d, g[t]);
    gm.emplace_back(d, m[t]);
    gv.emplace_back(d, v[t]);
  }
  for (std::size_t t = 0; t < sizes.size(); ++t)
    refs.push_back({gp[t].data(), gg[t].data(), gm[t].data(), gv[t].data(), sizes[t], t != 1});
  // The norm first (of the gradients), against the host in double.
  std::vector<weft::cuda::TensorRef> grads;
  double ref_sq = 0;
  for (std::size_t t = 0; t < sizes.size(); ++t) {
    grads.push_back({gg[t].data(), nullptr, nullptr, nullptr, sizes[t], 0});
    ref_sq += host::sum_squares(g[t].data(), sizes[t]);
  }
  const double sq = weft::cuda::sum_squares(d, grads);
  CHECK(std::fabs(sq - ref_sq) <= 1e-12 * ref_sq);  // both sum float squares in double, in another order
  weft::cuda::adamw(d, refs, a);
  for (std::size_t t = 0; t < sizes.size(); ++t) {
    host::adamw(p[t].data(), g[t].data(), m[t].data(), v[t].data(), sizes[t], a, t != 1);
    const auto widen_f = [](const std::vector<float>& x) { return V(x.begin(), x.end()); };
    // The same float formula on both sides; only contraction into FMAs may differ.
    CHECK(rel_error(gp[t].get(d), widen_f(p[t])) <= 1e-6);
    CHECK(rel_error(gm[t].get(d), widen_f(m[t])) <= 1e-6);
    CHECK(rel_error(gv[t].get(d), widen_f(v[t])) <= 1e-6);
  }
}
