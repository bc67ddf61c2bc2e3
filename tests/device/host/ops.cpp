// Host reference ops: closed forms where there are some, and finite differences in double for
// every backward (tolerance 1e-6, see support/gradcheck.hpp).
#include <doctest/doctest.h>

#include <cmath>
#include <vector>

#include "support/gradcheck.hpp"
#include "weft/ops/all.hpp"
#include "weft/ops/rmsnorm.hpp"
#include "weft/ops/rotary.hpp"
#include "weft/ops/swiglu.hpp"

using namespace weft;
using test::gradcheck;
using test::normals;
using V = std::vector<double>;

TEST_CASE("gelu matches the tanh formula and its derivative matches finite differences") {
  // Closed-form values of the tanh approximation at x = 1: 0.5 (1 + tanh(sqrt(2/pi) 1.044715)).
  CHECK(math::gelu(1.0) == doctest::Approx(0.8411919906082768).epsilon(1e-15));
  CHECK(math::gelu(0.0) == 0.0);
  for (double x : {-3.0, -1.2, -0.1, 0.0, 0.3, 1.0, 2.5}) {
    const double fd = (math::gelu(x + 1e-5) - math::gelu(x - 1e-5)) / 2e-5;
    CHECK(std::fabs(math::gelu_grad(x) - fd) < 1e-9);
  }
}

TEST_CASE("layernorm forward normalizes rows and backward matches finite differences") {
  const host::index N = 5, C = 7;
  V x = normals(N * C, 1, 2.0), w = normals(C, 2), b = normals(C, 3), R = normals(N * C, 4);
  for (double& v : x) v += 0.5;  // a non-zero mean
  V out(N * C), mean(N), rstd(N);
  auto loss = [&] {
    host::layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C, 1e-5);
    return test::dot(out, R);
  };
  loss();
  // With w = 1, b = 0 each row has mean 0 and variance var / (var + eps).
  V ones(C, 1.0), zeros(C, 0.0), plain(N * C);
  host::layernorm_forward(plain.data(), mean.data(), rstd.data(), x.data(), ones.data(), zeros.data(), N, C, 1e-5);
  for (host::index n = 0; n < N; ++n) {
    double m = 0, v = 0;
    for (host::index c = 0; c < C; ++c) m += plain[static_cast<std::size_t>(n * C + c)] / C;
    for (host::index c = 0; c < C; ++c) v += std::pow(plain[static_cast<std::size_t>(n * C + c)] - m, 2) / C;
    CHECK(std::fabs(m) < 1e-14);
    CHECK(v == doctest::Approx(1.0).epsilon(1e-4));  // 1 - eps / var
  }
  loss();
  V dx(N * C), dw(C, 0.0), db(C, 0.0);
  host::layernorm_backward(dx.data(), dw.data(), db.data(), R.data(), x.data(), w.data(), mean.data(), rstd.data(), N,
                           C);
  CHECK(gradcheck(x, dx, loss).worst <= 1e-6);
  CHECK(gradcheck(w, dw, loss).worst <= 1e-6);
  CHECK(gradcheck(b, db, loss).worst <= 1e-6);
}

TEST_CASE("causal attention: rows of probs sum to one with the future masked and backward matches finite differences") {
  const host::index B = 2, T = 5, H = 2, hd = 3;
  V qkv = normals(B * T * H * 3 * hd, 5), R = normals(B * T * H * hd, 6);
  V out(B * T * H * hd), probs(B * H * T * T);
  auto loss = [&] {
    host::attention_forward(out.data(), probs.data(), qkv.data(), B, T, H, hd);
    return test::dot(out, R);
  };
  loss();
  for (host::index r = 0; r < B * H * T; ++r) {
    const host::index i = r % T;
    double s = 0;
    for (host::index j = 0; j < T; ++j) {
      const double p = probs[static_cast<std::size_t>(r * T + j)];
      if (j > i) CHECK(p == 0.0);
      s += p;
    }
    CHECK(s == doctest::Approx(1.0).epsilon(1e-14));
  }
  // The first token attends only to itself: its output is its own v.
  for (host::index d = 0; d < hd; ++d)
    CHECK(out[static_cast<std::size_t>(d)] == qkv[static_cast<std::size_t>(2 * hd + d)]);
  V dqkv(qkv.size());
  host::attention_backward(dqkv.data(), R.data(), qkv.data(), probs.data(), B, T, H, hd);
  const auto r = gradcheck(qkv, dqkv, loss, 200);
  CHECK(r.checked == 180);  // all of them: 2 x 5 x 2 x 3 x 3
  CHECK(r.worst <= 1e-6);
}

// Masked attention written out from its definition, for g = 1: out_i = sum_j softmax_j(q_i k_j /
// sqrt(hd)) v_j over the keys j that query i sees, (!causal or j <= i) and j < lengths[b]; the
// independent reference of ops::Mask's two choices and padding.
namespace {
V masked_attention(const V& qkv, host::index B, host::index T, host::index H, host::index hd, bool causal,
                   const std::vector<std::int32_t>& lengths) {
  V out(static_cast<std::size_t>(B * T * H * hd), 0.0);
  const auto at = [&](host::index b, host::index t, host::index h, host::index w, host::index d) {
    return qkv[static_cast<std::size_t>((((b * T + t) * H + h) * 3 + w) * hd + d)];
  };
  for (host::index b = 0; b < B; ++b)
    for (host::index h = 0; h < H; ++h)
      for (host::index i = 0; i < T; ++i) {
        V w(static_cast<std::size_t>(T), 0.0);
        double z = 0;
        for (host::index j = 0; j < T; ++j) {
          if ((causal && j > i) || (!lengths.empty() && j >= lengths[static_cast<std::size_t>(b)])) continue;
          double s = 0;
          for (host::index d = 0; d < hd; ++d) s += at(b, i, h, 0, d) * at(b, j, h, 1, d);
          z += (w[static_cast<std::size_t>(j)] = std::exp(s / std::sqrt(static_cast<double>(hd))));
        }
        for (host::index j = 0; j < T; ++j)
          for (host::index d = 0; d < hd; ++d)
            out[static_cast<std::size_t>(((b * T + i) * H + h) * hd + d)] +=
                w[static_cast<std::size_t>(j)] / z * at(b, j, h, 2, d);
      }
  return out;
}
}  // namespace

TEST_CASE("attention without a mask and with padding: the definition's output, zeros where hidden, and gradients") {
  const host::index B = 2, T = 6, H = 2, hd = 3;
  const std::vector<std::int32_t> lengths{6, 4};  // the second sample's last two positions are padding
  for (const bool causal : {false, true})
    for (const bool padded : {false, true}) {
      INFO((causal ? "causal" : "bidirectional"), (padded ? ", padded" : ""));
      const ops::Mask m{causal, padded ? lengths.data() : nullptr};
      V qkv = normals(B * T * H * 3 * hd, 21), R = normals(B * T * H * hd, 22);
      V out(B * T * H * hd), probs(B * H * T * T);
      auto loss = [&] {
        host::attention_forward(out.data(), probs.data(), qkv.data(), B, T, H, hd, 1, m);
        return test::dot(out, R);
      };
      loss();
      // Sums of 6 exponentials in another order: rounding alone, 1e-14.
      const V want = masked_attention(qkv, B, T, H, hd, causal, padded ? lengths : std::vector<std::int32_t>{});
      double worst = 0;
      for (std::size_t i = 0; i < out.size(); ++i) worst = test::worse(worst, std::fabs(out[i] - want[i]));
      CHECK(worst <= 1e-14);
      for (host::index r = 0; r < B * H * T; ++r) {
        const host::index i = r % T, b = r / (H * T);
        for (host::index j = 0; j < T; ++j)
          if (!m.sees(b, i, j)) CHECK(probs[static_cast<std::size_t>(r * T + j)] == 0.0);
      }
      V dqkv(qkv.size());
      host::attention_backward(dqkv.data(), R.data(), qkv.data(), probs.data(), B, T, H, hd, 1, m);
      const auto r = gradcheck(qkv, dqkv, loss, 300);
      CHECK(r.checked == 216);  // all of them: 2 x 6 x 2 x 3 x 3
      CHECK(r.worst <= 1e-6);
      if (padded)  // the padded keys and values feed no output: their gradients are exact zeros
        for (host::index t = 4; t < T; ++t)
          for (host::index e = 0; e < 3 * H * hd; ++e)
            if (e % (3 * hd) >= hd) CHECK(dqkv[static_cast<std::size_t>((T + t) * 3 * H * hd + e)] == 0.0);
    }
}

TEST_CASE("attention refuses padding lengths outside 1..T, naming the sample") {
  Host dev;
  V qkv(2 * 4 * 3 * 2), out(2 * 4 * 2), probs(2 * 4 * 4);
  for (std::int32_t bad : {0, 5, -1}) {
    const std::vector<std::int32_t> lengths{4, bad};
    const std::string want = cat("ops::Attention<Host>::forward: sample 1 has ", bad, " valid positions of 4");
    CHECK_THROWS_WITH_AS(
        ops::Attention<Host>::forward(dev, out.data(), probs.data(), qkv.data(), 2, 4, 1, 2, 1, {true, lengths.data()}),
        doctest::Contains(want.c_str()), Error);
  }
}

TEST_CASE("vocab-parallel embedding: a shard looks up its rows and zeros the rest and backward accumulates") {
  const host::index C = 4;
  const std::vector<std::int32_t> tokens{3, 7, 3, 0, 5};
  V table = normals(4 * C, 7);  // rows 4..7 of the vocabulary
  V out(tokens.size() * C);
  host::embedding_forward(out.data(), tokens.data(), table.data(), 5, C, 4, 8);
  for (host::index c = 0; c < C; ++c) {
    CHECK(out[static_cast<std::size_t>(c)] == 0.0);                                             // token 3: elsewhere
    CHECK(out[static_cast<std::size_t>(C + c)] == table[static_cast<std::size_t>(3 * C + c)]);  // token 7: row 3
  }
  V R = normals(out.size(), 8), dtable(table.size(), 0.0);
  host::embedding_backward(dtable.data(), R.data(), tokens.data(), 5, C, 4, 8);
  auto loss = [&] {
    host::embedding_forward(out.data(), tokens.data(), table.data(), 5, C, 4, 8);
    return test::dot(out, R);
  };
  CHECK(gradcheck(table, dtable, loss).worst <= 1e-6);
}

TEST_CASE(
    "cross-entropy pieces give log-softmax loss with padded columns masked and the softmax-minus-onehot gradient") {
  const host::index N = 4, Vn = 7, valid = 6;  // one padded column
  V logits = normals(N * Vn, 9, 3.0);
  const std::vector<std::int32_t> targets{0, 5, 2, 3};
  auto loss_of = [&](V& lg, V& rowmax, V& stats) {
    host::ce_row_max(rowmax.data(), lg.data(), N, Vn, valid);
    host::ce_row_stats(stats.data(), lg.data(), rowmax.data(), targets.data(), N, Vn, valid, 0);
    double L = 0;
    for (host::index n = 0; n < N; ++n)
      L += std::log(stats[static_cast<std::size_t>(2 * n)]) + rowmax[static_cast<std::size_t>(n)] -
           stats[static_cast<std::size_t>(2 * n + 1)];
    return L / N;
  };
  V rowmax(N), stats(2 * N);
  const double L = loss_of(logits, rowmax, stats);
  // Independent: log(sum exp) - target, directly.
  double ref = 0;
  for (host::index n = 0; n < N; ++n) {
    double s = 0;
    for (host::index v = 0; v < valid; ++v) s += std::exp(logits[static_cast<std::size_t>(n * Vn + v)]);
    ref += std::log(s) - logits[static_cast<std::size_t>(n * Vn + targets[static_cast<std::size_t>(n)])];
  }
  CHECK(L == doctest::Approx(ref / N).epsilon(1e-14));
  V sumexp(N);
  for (host::index n = 0; n < N; ++n) sumexp[static_cast<std::size_t>(n)] = stats[static_cast<std::size_t>(2 * n)];
  V dlogits(logits.size());
  host::ce_backward(dlogits.data(), logits.data(), rowmax.data(), sumexp.data(), targets.data(), N, Vn, valid, 0,
                    1.0 / N);
  for (host::index n = 0; n < N; ++n) CHECK(dlogits[static_cast<std::size_t>(n * Vn + valid)] == 0.0);  // padding
  auto loss = [&] { return loss_of(logits, rowmax, stats); };
  CHECK(gradcheck(logits, dlogits, loss).worst <= 1e-6);
}

// The float paths (Eigen's vectorized tanh and exp, attention on GEMMs) against the double loops.
namespace {
std::vector<float> to_float(const V& x) { return {x.begin(), x.end()}; }
double worst_abs(const std::vector<float>& a, const V& b) {
  double w = 0;
  for (std::size_t i = 0; i < a.size(); ++i) w = test::worse(w, std::fabs(static_cast<double>(a[i]) - b[i]));
  return w;
}
}  // namespace

TEST_CASE("float gelu: within 1e-6 of the double oracle, and the same bits at any address") {
  V x(4001);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = -10.0 + 0.005 * static_cast<double>(i);  // both tails and 0
  for (double far : {-1e30, -1e4, -100.0, 100.0, 1e4, 1e30}) x.push_back(far);               // no overflow into NaN
  const std::vector<float> xf = to_float(x);
  V y(x.size()), dy(x.size()), ones(x.size(), 1.0);
  host::gelu_forward(y.data(), x.data(), static_cast<host::index>(x.size()));
  host::gelu_backward(dy.data(), x.data(), ones.data(), static_cast<host::index>(x.size()));
  // The oracle takes the float input: what is left is the float math's error, within 1e-6 of
  // values up to 10 (a float ulp at 10 is 9.5e-7; std::tanh in float is 4.3e-7 off, 5.5e-7 in the
  // slope) and relatively beyond.
  V xd(xf.begin(), xf.end()), yd(x.size()), dyd(x.size());
  host::gelu_forward(yd.data(), xd.data(), static_cast<host::index>(x.size()));
  host::gelu_backward(dyd.data(), xd.data(), ones.data(), static_cast<host::index>(x.size()));
  std::vector<float> yf(x.size()), dyf(x.size()), onesf(x.size(), 1.0f);
  host::gelu_forward(yf.data(), xf.data(), static_cast<host::index>(x.size()));
  host::gelu_backward(dyf.data(), xf.data(), onesf.data(), static_cast<host::index>(x.size()));
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double scale = std::max(1.0, std::fabs(yd[i]));
    INFO("x = ", xd[i], ": gelu ", yf[i], " vs ", yd[i], ", slope ", dyf[i], " vs ", dyd[i]);
    CHECK(std::fabs(yf[i] - yd[i]) <= 1e-6 * scale);
    CHECK(std::fabs(dyf[i] - dyd[i]) <= 1e-6);
  }
  // Shifted by one element (another alignment, another chunk boundary): the same bits.
  std::vector<float> xs(xf.size() + 1), ys(xs.size());
  std::copy(xf.begin(), xf.end(), xs.begin() + 1);
  host::gelu_forward(ys.data() + 1, xs.data() + 1, static_cast<host::index>(xf.size()));
  CHECK(std::equal(yf.begin(), yf.end(), ys.begin() + 1));
}

TEST_CASE("float attention on GEMMs: the double loops' output, probabilities and gradients to float accuracy") {
  const host::index B = 2, T = 70, H = 3, hd = 8;  // three blocks of query rows, the last partial
  const V qkv = normals(B * T * H * 3 * hd, 11), dout = normals(B * T * H * hd, 12);
  const std::vector<float> qkvf = to_float(qkv), doutf = to_float(dout);
  const V qkvd(qkvf.begin(), qkvf.end()), doutd(doutf.begin(), doutf.end());  // the oracle on the float inputs
  V out(B * T * H * hd), probs(B * H * T * T), dqkv(qkv.size());
  host::attention_forward(out.data(), probs.data(), qkvd.data(), B, T, H, hd);
  host::attention_backward(dqkv.data(), doutd.data(), qkvd.data(), probs.data(), B, T, H, hd);
  std::vector<float> outf(out.size()), probsf(probs.size()), dqkvf(dqkv.size());
  host::attention_forward(outf.data(), probsf.data(), qkvf.data(), B, T, H, hd);
  host::attention_backward(dqkvf.data(), doutf.data(), qkvf.data(), probsf.data(), B, T, H, hd);
  // Sums of at most 70 products of unit normals (scores up to ~10): float's 6e-8 relative error
  // grows to about 1e-6 absolute; 1e-5 leaves room, and a wrong mask or transpose is off by 0.1 or more.
  CHECK(worst_abs(probsf, probs) <= 1e-5);
  CHECK(worst_abs(outf, out) <= 1e-5);
  CHECK(worst_abs(dqkvf, dqkv) <= 1e-5);
  for (host::index r = 0; r < B * H * T; ++r)
    for (host::index j = r % T + 1; j < T; ++j) CHECK(probsf[static_cast<std::size_t>(r * T + j)] == 0.0f);
  // Run again into other buffers: the same bits.
  std::vector<float> again(dqkvf.size());
  host::attention_backward(again.data(), doutf.data(), qkvf.data(), probsf.data(), B, T, H, hd);
  CHECK(again == dqkvf);
}

TEST_CASE("float attention on GEMMs, bidirectional and padded, grouped: the double loops' numbers to float accuracy") {
  // T = 70: three blocks of query rows, the last partial; lengths 70 and 45 (padding from inside the
  // second block); g = 2 (two queries share a key and a value), so the dk, dv products accumulate.
  const host::index B = 2, T = 70, H = 4, g = 2, hd = 8, row = (H / g) * (g + 2) * hd;
  const std::vector<std::int32_t> lengths{70, 45};
  const V qkv = normals(B * T * row, 13), dout = normals(B * T * H * hd, 14);
  const std::vector<float> qkvf = to_float(qkv), doutf = to_float(dout);
  const V qkvd(qkvf.begin(), qkvf.end()), doutd(doutf.begin(), doutf.end());
  for (const bool causal : {false, true})
    for (const bool padded : {false, true}) {
      INFO((causal ? "causal" : "bidirectional"), (padded ? ", padded" : ""));
      const ops::Mask m{causal, padded ? lengths.data() : nullptr};
      V out(B * T * H * hd), probs(B * H * T * T), dqkv(qkv.size());
      host::attention_forward(out.data(), probs.data(), qkvd.data(), B, T, H, hd, g, m);
      host::attention_backward(dqkv.data(), doutd.data(), qkvd.data(), probs.data(), B, T, H, hd, g, m);
      std::vector<float> outf(out.size()), probsf(probs.size()), dqkvf(dqkv.size());
      host::attention_forward(outf.data(), probsf.data(), qkvf.data(), B, T, H, hd, g, m);
      host::attention_backward(dqkvf.data(), doutf.data(), qkvf.data(), probsf.data(), B, T, H, hd, g, m);
      // As above: sums of at most 70 products in float; a wrong mask or range is off by 0.1 or more.
      CHECK(worst_abs(probsf, probs) <= 1e-5);
      CHECK(worst_abs(outf, out) <= 1e-5);
      CHECK(worst_abs(dqkvf, dqkv) <= 1e-5);
      for (host::index r = 0; r < B * H * T; ++r)
        for (host::index j = 0; j < T; ++j)
          if (!m.sees(r / (H * T), r % T, j)) CHECK(probsf[static_cast<std::size_t>(r * T + j)] == 0.0f);
    }
}

// Llama's ops (ops/swiglu.hpp, ops/rotary.hpp, ops/rmsnorm.hpp): the float paths (SwiGLU on Eigen's
// vectorized exp, the rotation on a cached table, RMSNorm on lane sums) against the double loops
// on the same float inputs.
TEST_CASE(
    "float SwiGLU: within 1e-6 of the double oracle (relative beyond 1), tails included, the same bits at any offset") {
  Host dev;
  V a;  // (gate, up) pairs: gates over [-20, 20] and far out, ups over [-3, 3]
  for (int i = 0; i <= 4000; ++i) a.insert(a.end(), {-20.0 + 0.01 * i, -3.0 + 0.0015 * i});
  for (double far : {-1e30, -1e4, -100.0, -87.0, 87.0, 100.0, 1e4}) a.insert(a.end(), {far, 0.75});
  const host::index n = static_cast<host::index>(a.size() / 2);
  const V dy = normals(static_cast<std::size_t>(n), 31);
  const std::vector<float> af = to_float(a), dyf = to_float(dy);
  const V ad(af.begin(), af.end()), dyd(dyf.begin(), dyf.end());
  V y(n), da(a.size());
  ops::SwiGlu<Host>::forward(dev, y.data(), ad.data(), n);
  ops::SwiGlu<Host>::backward(dev, da.data(), ad.data(), dyd.data(), n);
  std::vector<float> yf(n), daf(a.size());
  ops::SwiGlu<Host>::forward(dev, yf.data(), af.data(), n);
  ops::SwiGlu<Host>::backward(dev, daf.data(), af.data(), dyf.data(), n);
  // A handful of float roundings (the exp within 2 ulp, a division, three products): under 1e-6
  // relative; at g = -20 the gate's slope is 4e-8, where an error in 1 - sigmoid would show.
  for (host::index i = 0; i < n; ++i) {
    const auto k = static_cast<std::size_t>(i);
    INFO("gate ", ad[2 * k], ", up ", ad[2 * k + 1], ": y ", yf[k], " vs ", y[k], "; dgate ", daf[2 * k], " vs ",
         da[2 * k], "; dup ", daf[2 * k + 1], " vs ", da[2 * k + 1]);
    CHECK(std::isfinite(yf[k]));
    CHECK(std::fabs(yf[k] - y[k]) <= 1e-6 * std::max(1.0, std::fabs(y[k])));
    CHECK(std::fabs(daf[2 * k] - da[2 * k]) <= 1e-6 * std::max(1.0, std::fabs(da[2 * k])));
    CHECK(std::fabs(daf[2 * k + 1] - da[2 * k + 1]) <= 1e-6 * std::max(1.0, std::fabs(da[2 * k + 1])));
  }
  // From one element in (another alignment, other chunk boundaries): the same bits.
  std::vector<float> ys(n - 1);
  ops::SwiGlu<Host>::forward(dev, ys.data(), af.data() + 2, n - 1);
  CHECK(std::equal(ys.begin(), ys.end(), yf.begin() + 1));
}

TEST_CASE("float rotary and RMSNorm: the double loops on the same inputs, to float accuracy") {
  Host dev;
  const host::index B = 2, T = 37, G = 2, g = 3, hd = 16, N = B * T, C = 40;
  const ops::Rope rope{.theta = 500000.0, .factor = 8.0, .original_max_positions = 16};  // all three bands at hd 16
  const auto sz = [](host::index k) { return static_cast<std::size_t>(k); };
  const V qkv = normals(sz(N * G * (g + 2) * hd), 32), x = normals(sz(N * C), 33), w = normals(sz(C), 34),
          dy = normals(sz(N * C), 35), res = normals(sz(N * C), 36);
  const std::vector<float> qkvf = to_float(qkv), xf = to_float(x), wf = to_float(w), dyf = to_float(dy),
                           resf = to_float(res);
  const V qkvd(qkvf.begin(), qkvf.end()), xd(xf.begin(), xf.end()), wd(wf.begin(), wf.end()),
      dyd(dyf.begin(), dyf.end()), resd(resf.begin(), resf.end());
  SUBCASE("rotary at positions 5 .. 41, forward then backward (back to the input)") {
    V r = qkvd;
    std::vector<float> rf = qkvf;
    ops::Rotary<Host>::forward(dev, r.data(), B, T, G, g, hd, rope, 5);
    ops::Rotary<Host>::forward(dev, rf.data(), B, T, G, g, hd, rope, 5);
    // Two products and a sum of unit normals, angles rounded to float: a few 1e-7.
    CHECK(worst_abs(rf, r) <= 1e-6);
    CHECK(worst_abs(rf, qkvd) > 0.1);  // it rotated something
    ops::Rotary<Host>::backward(dev, rf.data(), B, T, G, g, hd, rope, 5);
    CHECK(worst_abs(rf, qkvd) <= 1e-6);  // the rotation's transpose is its inverse
    // Positions 0 .. 36 next (the cached table must not be reused): the double oracle at 0.
    V r0 = qkvd;
    std::vector<float> r0f = qkvf;
    ops::Rotary<Host>::forward(dev, r0.data(), B, T, G, g, hd, rope, 0);
    ops::Rotary<Host>::forward(dev, r0f.data(), B, T, G, g, hd, rope, 0);
    CHECK(worst_abs(r0f, r0) <= 1e-6);
    CHECK(worst_abs(r0f, r) > 0.1);
  }
  SUBCASE("RMSNorm forward and backward with the residual gradient") {
    V y(N * C), rstd(N), dx(N * C), dw(C, 0.0);
    ops::RmsNorm<Host>::forward(dev, y.data(), rstd.data(), xd.data(), wd.data(), N, C, 1e-5);
    ops::RmsNorm<Host>::backward(dev, dx.data(), dw.data(), dyd.data(), xd.data(), wd.data(), rstd.data(), N, C,
                                 resd.data());
    std::vector<float> yf(N * C), rstdf(N), dxf(N * C), dwf(C, 0.0f);
    ops::RmsNorm<Host>::forward(dev, yf.data(), rstdf.data(), xf.data(), wf.data(), N, C, 1e-5f);
    ops::RmsNorm<Host>::backward(dev, dxf.data(), dwf.data(), dyf.data(), xf.data(), wf.data(), rstdf.data(), N, C,
                                 resf.data());
    // Sums of 40 (rows) and 74 (the weight's gradient) terms of unit size: float error about 1e-6.
    CHECK(worst_abs(yf, y) <= 1e-5);
    CHECK(worst_abs(rstdf, rstd) <= 1e-5);
    CHECK(worst_abs(dxf, dx) <= 1e-5);
    CHECK(worst_abs(dwf, dw) <= 1e-5);
  }
}

TEST_CASE(
    "init_normal: a large shard drawn on every core has the bits of one thread's draws, and a shard those of the whole") {
  // 3 x 2^20 + 5 elements: several threads wherever there are several cores (a range per thread),
  // against the single-thread range; then a column shard (offset 1000 of 2048 columns) against the
  // whole tensor's elements at the same global indices. Bitwise: each draw depends on its index alone.
  const Shape whole{1536 + 1, 2048};
  std::vector<float> all(static_cast<std::size_t>(whole.numel())), one(all.size());
  host::init_normal(all.data(), whole, whole, Shape{0, 0}, 7, 3, 0.02);
  host::detail::init_normal_range(one.data(), whole, whole, Shape{0, 0}, 7, 3, 0.02, 0, whole.numel());
  CHECK(all == one);
  const Shape local{1536 + 1, 1024};
  std::vector<float> shard(static_cast<std::size_t>(local.numel()));
  host::init_normal(shard.data(), whole, local, Shape{0, 1000}, 7, 3, 0.02);
  bool same = true;
  for (std::int64_t r = 0; r < local[0]; ++r)
    for (std::int64_t c = 0; c < local[1]; ++c)
      same =
          same && shard[static_cast<std::size_t>(r * 1024 + c)] == all[static_cast<std::size_t>(r * 2048 + 1000 + c)];
  CHECK(same);
  // The draws are normal with the given scale: mean within 4 standard errors of 0, std within 1%.
  double sum = 0, sq = 0;
  for (float v : all) {
    sum += v;
    sq += static_cast<double>(v) * v;
  }
  const double n = static_cast<double>(all.size()), mean = sum / n, sd = std::sqrt(sq / n - mean * mean);
  CHECK(std::fabs(mean) < 4 * 0.02 / std::sqrt(n));
  CHECK(std::fabs(sd / 0.02 - 1) < 0.01);
}
