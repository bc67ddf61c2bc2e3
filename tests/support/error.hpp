// defines: test::worse, test::max_abs_error, test::rel_error: the error metrics every test takes
// its largest error with.
//
// Each returns infinity when any value it looks at is not finite (NaN or an infinity, on either
// side) or the sizes differ, so a NaN can never score an error of 0. `std::max(err, NaN)` returns
// err: a running maximum written with std::max ignores a NaN output, and the classic ring-attention
// bug (a merge of fully masked blocks, -inf - -inf) makes exactly such NaNs.
//
// Use `worst = test::worse(worst, e)` wherever a loop keeps the largest error.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <vector>

namespace weft::test {

inline constexpr double kNotFinite = std::numeric_limits<double>::infinity();

// The larger of a running maximum and a new error; infinity from any non-finite error on.
inline double worse(double worst, double e) {
  return std::isfinite(e) && std::isfinite(worst) ? std::max(worst, e) : kNotFinite;
}

// max |got[i] - want[i]|.
template <class A, class B>
double max_abs_error(const std::vector<A>& got, const std::vector<B>& want) {
  if (got.size() != want.size()) return kNotFinite;
  double worst = 0;
  for (std::size_t i = 0; i < got.size(); ++i)
    worst = worse(worst, std::fabs(static_cast<double>(got[i]) - static_cast<double>(want[i])));
  return worst;
}

// max |got - want| / max |want|: the error relative to the size of the reference tensor.
inline double rel_error(const std::vector<double>& got, const std::vector<double>& want) {
  if (got.size() != want.size()) return kNotFinite;
  double scale = 0;
  for (double w : want) scale = worse(scale, std::fabs(w));
  return worse(0, max_abs_error(got, want) / std::max(scale, 1e-300));
}

}  // namespace weft::test
