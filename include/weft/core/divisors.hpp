// A few valid values to suggest in a message, in time independent of the number's magnitude:
// the divisors of n among 1..1024 and their cofactors (every divisor when n <= 1024^2), the ones
// nearest `near` (by ratio) first, at most `count`, listed in increasing order.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "weft/core/error.hpp"

namespace weft {

inline std::vector<std::int64_t> divisors_near(std::int64_t n, std::int64_t near, std::size_t count = 8) {
  std::vector<std::int64_t> d;
  if (n < 1) return d;
  for (std::int64_t i = 1; i <= std::min<std::int64_t>(n, 1024); ++i)
    if (n % i == 0) {
      d.push_back(i);
      d.push_back(n / i);
    }
  std::sort(d.begin(), d.end());
  d.erase(std::unique(d.begin(), d.end()), d.end());
  const double at = std::log(static_cast<double>(std::max<std::int64_t>(near, 1)));
  std::sort(d.begin(), d.end(), [&](std::int64_t a, std::int64_t b) {  // nearest first; ties the smaller first
    const double da = std::fabs(std::log(static_cast<double>(a)) - at),
                 db = std::fabs(std::log(static_cast<double>(b)) - at);
    return da != db ? da < db : a < b;
  });
  if (d.size() > count) d.resize(count);
  std::sort(d.begin(), d.end());
  return d;
}

// The same, joined: "1, 2, 4, 8".
inline std::string list_divisors(std::int64_t n, std::int64_t near, std::size_t count = 8) {
  return join(divisors_near(n, near, count));
}

}  // namespace weft
