#include <doctest/doctest.h>

#include <vector>

#include "weft/device/host/host.hpp"
#include "weft/tensor/tensor.hpp"

using namespace weft;

TEST_CASE("Tensor holds the local shard knows the global shape and counts its bytes") {
  Host h;
  const Spread s{.data_degree = 2, .tensor_degree = 4, .data_index = 1, .tensor_index = 2};
  auto t = Tensor<float, Layout<Shard<0>, Shard<-1>>, Host>::zeros(h, {8, 5, 16}, s, Category::activations);
  CHECK(t.global_shape() == Shape{8, 5, 16});
  CHECK(t.local_shape() == Shape{4, 5, 4});
  CHECK(t.numel() == 80);
  CHECK(h.memory().current_of(Category::activations) == 80 * 4);
  CHECK(t[79] == 0.0f);
  // Local element (0, 0, 0) sits at global (4, 0, 8); local (3, 4, 3) at global (7, 4, 11).
  CHECK(t.global_index(0) == (4 * 5 + 0) * 16 + 8);
  CHECK(t.global_index(79) == (7 * 5 + 4) * 16 + 11);
  auto c = t.clone();
  c[0] = 3.0f;
  CHECK(t[0] == 0.0f);
  CHECK(h.memory().current_of(Category::other) == 80 * 4);
}

TEST_CASE("Tensor views do not own or count memory") {
  Host h;
  std::vector<double> buf(12, 2.0);
  auto v = Tensor<double, Replicated, Host>::view(h, buf.data(), {3, 4}, {});
  CHECK_FALSE(v.owns_storage());
  CHECK(v[11] == 2.0);
  CHECK(h.memory().total_current == 0);
}

TEST_CASE("Tensor refuses shapes its layout cannot split") {
  Host h;
  CHECK_THROWS_WITH_AS((Tensor<float, TensorSharded<1>, Host>::empty(h, {4, 6}, {.tensor_degree = 4})),
                       doctest::Contains("extent 6, not divisible by the tensor degree 4"), Error);
}

TEST_CASE("global_index agrees with local_box: local element i sits at the box offset plus its local position") {
  Host h;
  using L = Layout<Shard<1>, Shard<0>>;
  const Shape g{6, 4, 2};
  for (int di = 0; di < 2; ++di)
    for (int ti = 0; ti < 3; ++ti) {
      const Spread s{.data_degree = 2, .tensor_degree = 3, .data_index = di, .tensor_index = ti};
      auto t = Tensor<float, L, Host>::empty(h, g, s);
      const Box b = local_box<L>(g, s);
      for (std::int64_t i = 0; i < t.numel(); ++i) {
        const std::int64_t r = i / (b.extent[1] * b.extent[2]), c = i / b.extent[2] % b.extent[1], k = i % b.extent[2];
        CHECK(t.global_index(i) == ((b.offset[0] + r) * g[1] + b.offset[1] + c) * g[2] + b.offset[2] + k);
      }
    }
}
