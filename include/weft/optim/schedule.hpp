// Learning-rate schedules: constant, and linear warm-up followed by cosine decay to a floor.
//
//   warmup_cosine(max, warmup, total, floor):
//     step < warmup:           max (step + 1) / warmup
//     warmup <= step < total:  floor + (max - floor) (1 + cos(pi (step - warmup) / (total - warmup))) / 2
//     step >= total:           floor
#pragma once

#include <cmath>
#include <cstdint>
#include <numbers>

#include "weft/core/error.hpp"

namespace weft::optim {

struct Schedule {
  double max_lr = 6e-4, min_lr = 0;
  std::int64_t warmup = 0, total = 0;  // total 0: constant max_lr

  static Schedule constant(double lr) { return {lr, lr, 0, 0}; }
  static Schedule warmup_cosine(double max_lr, std::int64_t warmup, std::int64_t total, double min_lr) {
    // Written so that NaN fails every test (NaN compares false).
    const bool ok = std::isfinite(max_lr) && std::isfinite(min_lr) && max_lr > 0 && min_lr >= 0 && min_lr <= max_lr &&
                    warmup >= 0 && total >= 1 && warmup <= total;
    if (!ok)
      throw Error("Schedule", cat("max lr ", max_lr, ", min lr ", min_lr, ", warm-up ", warmup, ", total ", total),
                  "use finite rates, 0 <= min lr <= max lr, max lr > 0 and 0 <= warm-up <= total steps");
    return {max_lr, min_lr, warmup, total};
  }

  double lr(std::int64_t step) const {
    if (total == 0) return max_lr;
    if (step < warmup) return max_lr * static_cast<double>(step + 1) / static_cast<double>(warmup);
    if (step >= total) return min_lr;
    const double progress =
        static_cast<double>(step - warmup) / static_cast<double>(std::max<std::int64_t>(1, total - warmup));
    return min_lr + (max_lr - min_lr) * 0.5 * (1.0 + std::cos(std::numbers::pi * progress));
  }
};

}  // namespace weft::optim
