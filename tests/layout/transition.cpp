// Plans: collective, axis, shapes and bytes per rank for given shapes and degrees.
#include <doctest/doctest.h>

#include "weft/layout/transition.hpp"

using namespace weft;

TEST_CASE("the redistribution of an all_gather on the tensor axis (the worked example of transition.hpp)") {
  constexpr Redistribution p = redistribution<TensorSharded<1>, Replicated>({8, 16}, {.tensor_degree = 4}, 4);
  static_assert(p.count == 1);  // a constant expression
  const CommStep& s = p.steps[0];
  CHECK(s.collective == Collective::all_gather);
  CHECK(s.axis == Axis::tensor);
  CHECK(s.local_in == Shape{8, 4});
  CHECK(s.local_out == Shape{8, 16});
  CHECK(s.bytes_in == 128);
  CHECK(s.bytes_out == 512);
  CHECK(s.wire_bytes == 384);  // (n - 1) / n of the output: three quarters of 512
}

TEST_CASE("ring wire bytes per collective match the nccl-tests bus-bandwidth factors") {
  const Spread s{.data_degree = 4, .tensor_degree = 2};
  // all_reduce of 1 MiB over 4 ranks sends 2 (n-1)/n S = 1.5 MiB per rank.
  CHECK(redistribution<Layout<Partial, Replicate>, Replicated>({1 << 18}, s, 4).steps[0].wire_bytes == 3 << 19);
  // reduce_scatter: (n-1)/n of the input.
  const Redistribution rs = redistribution<Layout<Partial, Replicate>, DataSharded<0>>({1 << 18}, s, 4);
  CHECK(rs.steps[0].collective == Collective::reduce_scatter);
  CHECK(rs.steps[0].wire_bytes == 3 << 18);
  CHECK(rs.steps[0].bytes_out == 1 << 18);
  // all_to_all: (n-1)/n of the buffer, which keeps its size.
  const Redistribution aa = redistribution<TensorSharded<0>, TensorSharded<1>>({8, 8}, s, 8);
  CHECK(aa.steps[0].collective == Collective::all_to_all);
  CHECK(aa.steps[0].local_in == Shape{4, 8});
  CHECK(aa.steps[0].local_out == Shape{8, 4});
  CHECK(aa.steps[0].wire_bytes == 128);
  // Local steps move nothing over the wire.
  CHECK(redistribution<Replicated, TensorSharded<0>>({8, 8}, s, 8).wire_bytes() == 0);
}

TEST_CASE("two-axis redistributions order the shrinking step first and track shapes through both") {
  const Spread s{.data_degree = 2, .tensor_degree = 4};
  // Megatron SP to a batch-sharded replicated activation: data slice on dim 0, then tensor gather of dim 1.
  const Redistribution p = redistribution<Layout<Replicate, Shard<1>>, Layout<Shard<0>, Replicate>>({8, 16, 32}, s, 2);
  REQUIRE(p.count == 2);
  CHECK(p.steps[0].collective == Collective::slice);
  CHECK(p.steps[0].axis == Axis::data);
  CHECK(p.steps[0].local_out == Shape{4, 4, 32});
  CHECK(p.steps[1].collective == Collective::all_gather);
  CHECK(p.steps[1].axis == Axis::tensor);
  CHECK(p.steps[1].local_out == Shape{4, 16, 32});
  CHECK(p.wire_bytes() == 3 * 4 * 4 * 32 * 2);  // gather sends (n-1)/n of its 4096-byte output
  // No-op transitions have no steps.
  CHECK(redistribution<Replicated, Replicated>({8}, s, 4).count == 0);
}

TEST_CASE("redistributions refuse extents the degrees do not divide") {
  CHECK_THROWS_WITH_AS((redistribution<Replicated, TensorSharded<0>>({6, 4}, {.tensor_degree = 4}, 4)),
                       doctest::Contains("extent 6, not divisible by the tensor degree 4"), Error);
}
