// The fixed embeddings of a Diffusion Transformer (DiT, Peebles and Xie 2023), as diffusers'
// DiTTransformer2DModel lays them out: computed on the host in double, once per run (positions) or
// per batch (timesteps). The first pieces of the DiT family (issue 53); its stages build on them.
//
//   sincos_1d(d, p)        d values for position p: [sin(p w_k) | cos(p w_k)], k < d/2,
//                          w_k = 10000^(-k / (d/2))
//   sincos_2d(D, H, W, s)  (H W, D): token (i, j) of an H x W grid of patches (row-major) is
//                          [sincos_1d(D/2, j / s) | sincos_1d(D/2, i / s)], the column first, s the
//                          interpolation scale (1 for DiT's sizes)
//   timestep_features(t, d, flip, shift, max_period)
//                          (B, d): f_k = exp(-ln(max_period) k / (d/2 - shift)), k < d/2;
//                          [sin(t f_k) | cos(t f_k)], or [cos | sin] when flip (DiT: d 256,
//                          flip, shift 1, max_period 10000); a zero appended when d is odd
//
// Example: sincos_1d(4, 1) = [sin 1, sin 0.01, cos 1, cos 0.01].
//
// tests/models/dit/embeddings.cpp holds these to their closed forms and to diffusers' own
// (tools/reference/dit_reference.py writes the fixtures).
//
// This header is plain C++20.
//
// defines: dit::sincos_1d, dit::sincos_2d, dit::timestep_features
#pragma once

#include <cmath>
#include <cstdint>
#include <span>
#include <vector>

#include "weft/core/error.hpp"

namespace weft::dit {

inline std::vector<double> sincos_1d(std::int64_t d, double p) {
  if (d < 2 || d % 2 != 0)
    throw Error("dit::sincos_1d", cat("an embedding of ", d, " values"), "use an even width of 2 or more");
  const std::int64_t half = d / 2;
  std::vector<double> out(static_cast<std::size_t>(d));
  for (std::int64_t k = 0; k < half; ++k) {
    const double w = std::pow(10000.0, -static_cast<double>(k) / static_cast<double>(half));
    out[static_cast<std::size_t>(k)] = std::sin(p * w);
    out[static_cast<std::size_t>(half + k)] = std::cos(p * w);
  }
  return out;
}

inline std::vector<double> sincos_2d(std::int64_t D, std::int64_t H, std::int64_t W, double scale = 1.0) {
  if (D < 4 || D % 4 != 0 || H < 1 || W < 1 || !(scale > 0))
    throw Error("dit::sincos_2d", cat("a width of ", D, " over a grid of ", H, " x ", W, " at scale ", scale),
                "use a width that 4 divides, a grid of at least 1 x 1 and a positive scale");
  std::vector<double> out;
  out.reserve(static_cast<std::size_t>(H * W * D));
  for (std::int64_t i = 0; i < H; ++i)
    for (std::int64_t j = 0; j < W; ++j) {
      const auto col = sincos_1d(D / 2, static_cast<double>(j) / scale),
                 row = sincos_1d(D / 2, static_cast<double>(i) / scale);
      out.insert(out.end(), col.begin(), col.end());
      out.insert(out.end(), row.begin(), row.end());
    }
  return out;
}

inline std::vector<double> timestep_features(std::span<const double> t, std::int64_t d, bool flip = true,
                                             double shift = 1.0, double max_period = 10000.0) {
  const std::int64_t half = d / 2;
  if (d < 2 || !(static_cast<double>(half) - shift > 0) || !(max_period > 1))
    throw Error("dit::timestep_features", cat("a width of ", d, " with a frequency shift of ", shift),
                "use a width of 2 or more whose half exceeds the shift, and a period above 1");
  std::vector<double> out(t.size() * static_cast<std::size_t>(d), 0.0);
  for (std::size_t b = 0; b < t.size(); ++b)
    for (std::int64_t k = 0; k < half; ++k) {
      const double f = std::exp(-std::log(max_period) * static_cast<double>(k) / (static_cast<double>(half) - shift));
      const double s = std::sin(t[b] * f), c = std::cos(t[b] * f);
      double* row = out.data() + b * static_cast<std::size_t>(d);
      row[flip ? half + k : k] = s;
      row[flip ? k : half + k] = c;
    }
  return out;
}

}  // namespace weft::dit
