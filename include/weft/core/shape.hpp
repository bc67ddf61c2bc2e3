// Shape: the extents of a tensor, rank 0 to 6, usable in constant expressions.
//
// Dimensions may be named from the end with negative indices, as in PyTorch: for a (B, T, C) shape,
// dim -1 is C. normalize_dim() turns such an index into 0..rank-1 and rejects the rest with an Error.
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <ostream>

#include "weft/core/error.hpp"

namespace weft {

class Shape {
 public:
  static constexpr int max_rank = 6;

  constexpr Shape() = default;
  constexpr Shape(std::initializer_list<std::int64_t> dims) {
    if (dims.size() > max_rank)
      throw Error("Shape", cat("rank ", dims.size(), " exceeds the maximum of ", max_rank),
                  "merge dimensions before building the tensor");
    for (std::int64_t d : dims) {
      if (d < 0) throw Error("Shape", cat("extent ", d, " is negative"), "use extents >= 0");
      dims_[rank_++] = d;
    }
  }

  constexpr int rank() const { return rank_; }
  constexpr std::int64_t operator[](int i) const { return dims_[static_cast<std::size_t>(i)]; }
  constexpr std::int64_t& operator[](int i) { return dims_[static_cast<std::size_t>(i)]; }

  constexpr std::int64_t numel() const {
    std::int64_t n = 1;
    for (int i = 0; i < rank_; ++i) n *= dims_[static_cast<std::size_t>(i)];
    return n;
  }
  // Product of the extents before dim d, and after it: a row-major tensor is (outer, extent(d), inner).
  constexpr std::int64_t outer(int d) const {
    std::int64_t n = 1;
    for (int i = 0; i < d; ++i) n *= (*this)[i];
    return n;
  }
  constexpr std::int64_t inner(int d) const {
    std::int64_t n = 1;
    for (int i = d + 1; i < rank_; ++i) n *= (*this)[i];
    return n;
  }

  // Maps dim in [-rank, rank) to [0, rank). Requires: that range. Example: {4, 6}.normalize_dim(-1) == 1.
  constexpr int normalize_dim(int dim) const {
    const int d = dim < 0 ? dim + rank_ : dim;
    if (d < 0 || d >= rank_)
      throw Error("Shape", cat("dim ", dim, " is out of range for a rank-", rank_, " tensor"),
                  cat("use a dim in [", -rank_, ", ", rank_, ")"));
    return d;
  }

  friend constexpr bool operator==(const Shape& a, const Shape& b) {
    if (a.rank_ != b.rank_) return false;
    for (int i = 0; i < a.rank_; ++i)
      if (a[i] != b[i]) return false;
    return true;
  }
  friend std::ostream& operator<<(std::ostream& os, const Shape& s) {
    os << '(';
    for (int i = 0; i < s.rank_; ++i) os << (i ? ", " : "") << s[i];
    return os << ')';
  }

 private:
  std::array<std::int64_t, max_rank> dims_{};
  int rank_ = 0;
};

}  // namespace weft
