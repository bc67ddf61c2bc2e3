// Compile-time queries of placements and layouts, and local shapes.
#include <doctest/doctest.h>

#include "weft/layout/layout.hpp"
#include "weft/layout/plan.hpp"

using namespace weft;

// Queries are constant expressions: these are checked by the compiler.
static_assert(Placement<Replicate> && Placement<Shard<-1>> && Placement<Partial> && !Placement<int>);
static_assert(is_sharded_on<Layout<Shard<0>, Replicate>, Axis::data>);
static_assert(!is_sharded_on<Layout<Shard<0>, Replicate>, Axis::tensor>);
static_assert(is_partial_on<TensorPartial, Axis::tensor> && is_replicated_on<TensorPartial, Axis::data>);
static_assert(std::is_same_v<dual_layout<Layout<Replicate, Shard<2>>>, Layout<Partial, Shard<2>>>);
static_assert(std::is_same_v<dual_layout<dual_layout<Layout<Partial, Shard<1>>>>, Layout<Partial, Shard<1>>>);

// The collective for each (From, To) on one axis: DESIGN.md's table.
static_assert(collective_on<Replicated, TensorSharded<1>, Axis::tensor> == Collective::slice);
static_assert(collective_on<TensorSharded<1>, Replicated, Axis::tensor> == Collective::all_gather);
static_assert(collective_on<TensorSharded<1>, TensorSharded<0>, Axis::tensor> == Collective::all_to_all);
static_assert(collective_on<TensorSharded<1>, TensorSharded<1>, Axis::tensor> == Collective::none);
static_assert(collective_on<TensorPartial, Replicated, Axis::tensor> == Collective::all_reduce);
static_assert(collective_on<TensorPartial, TensorSharded<0>, Axis::tensor> == Collective::reduce_scatter);
static_assert(collective_on<Replicated, TensorPartial, Axis::tensor> == Collective::keep_one);
static_assert(collective_on<TensorPartial, TensorPartial, Axis::tensor> == Collective::none);
static_assert(collective_on<TensorSharded<0>, TensorPartial, Axis::tensor> == Collective::embed);
static_assert(collective_on<Layout<Partial, Shard<0>>, Replicated, Axis::data> == Collective::all_reduce);

// Shrinking steps run first: a slice on tensor before an all_gather on data.
static_assert(Transition<DataSharded<0>, TensorSharded<1>>::steps[0].collective == Collective::slice);
static_assert(Transition<DataSharded<0>, TensorSharded<1>>::steps[1].collective == Collective::all_gather);
// Unless that order passes through nested sharding of one dim: here data must gather dim 0 first.
static_assert(Transition<DataSharded<0>, TensorSharded<0>>::steps[0].axis == Axis::data);
static_assert(!Transition<Layout<Shard<0>, Shard<1>>, Layout<Shard<1>, Shard<0>>>::possible);

TEST_CASE("local_shape divides each sharded dim by its axis degree") {
  const Spread s{.data_degree = 2, .tensor_degree = 3};
  CHECK(local_shape<Layout<Shard<0>, Shard<-1>>>({8, 5, 6}, s) == Shape{4, 5, 2});
  CHECK(local_shape<Layout<Partial, Shard<1>>>({8, 6}, s) == Shape{8, 2});
  CHECK(local_shape<Replicated>({8, 6}, s) == Shape{8, 6});
  static_assert(local_shape<Layout<Shard<0>, Shard<-1>>>({8, 6}, {.data_degree = 2, .tensor_degree = 3}) == Shape{4, 2});
}

TEST_CASE("local_shape rejects extents the degree does not divide naming the values") {
  const Spread s{.data_degree = 2, .tensor_degree = 4};
  CHECK_THROWS_WITH_AS(local_shape<TensorSharded<-1>>({8, 6}, s),
                       "Layout<Replicate, Shard<-1>>: dim 1 of shape (8, 6) has extent 6, not divisible by the tensor "
                       "degree 4; choose a degree that divides the extent, or pad the tensor",
                       Error);
  CHECK_THROWS_WITH_AS((local_shape<Layout<Shard<0>, Replicate>>({3, 6}, s)),
                       doctest::Contains("extent 3, not divisible by the data degree 2"), Error);
  // Shard<3> on a rank-2 tensor: the dim is out of range.
  CHECK_THROWS_WITH_AS(local_shape<TensorSharded<3>>({8, 6}, s), doctest::Contains("dim 3 is out of range"), Error);
}

TEST_CASE("local_shape rejects one dim sharded on both axes when spelled differently") {
  // Shard<1> and Shard<-1> are the same dim of a rank-2 tensor: only the shape tells.
  CHECK_THROWS_WITH_AS((local_shape<Layout<Shard<1>, Shard<-1>>>({8, 6}, {.data_degree = 2, .tensor_degree = 2})),
                       doctest::Contains("data and tensor axes both shard dim 1"), Error);
  CHECK_NOTHROW((local_shape<Layout<Shard<1>, Shard<-1>>>({8, 6, 4}, {.data_degree = 2, .tensor_degree = 2})));
}

TEST_CASE("Layout names itself") {
  CHECK(Layout<Shard<0>, Partial>::name() == "Layout<Shard<0>, Partial>");
}
