// defines: test::same_checkpoints: two weft checkpoints' tensors compared bit for bit (f64), for the
// tests that reshard a checkpoint through other layouts and back (tests/checkpoint/experts.cpp,
// tests/models/mixtral/expert_tensor.cpp).
#pragma once

#include <cstring>
#include <string>

#include "weft/checkpoint/checkpoint.hpp"

namespace weft::test {

// The first difference between checkpoints a and b (every tensor of a, in b, bit for bit), or "".
inline std::string same_checkpoints(const std::string& a, const std::string& b) {
  const checkpoint::Reader ra(a), rb(b);
  std::size_t compared = 0;
  for (const auto& [name, t] : ra.manifest().tensors) {
    if (!rb.has(name)) return cat(b, " lacks ", name);
    const auto x = ra.read<double>(name), y = rb.read<double>(name);
    if (x.size() != y.size()) return cat(name, ": ", x.size(), " against ", y.size(), " elements");
    for (std::size_t i = 0; i < x.size(); ++i)
      if (std::memcmp(&x[i], &y[i], sizeof(double)) != 0) return cat(name, "[", i, "]: ", x[i], " against ", y[i]);
    ++compared;
  }
  return compared == 0 ? "no tensors compared" : "";
}

}  // namespace weft::test
