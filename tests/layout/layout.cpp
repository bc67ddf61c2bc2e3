// Compile-time queries of placements and layouts, local shapes and the boxes ranks hold.
#include <doctest/doctest.h>

#include <utility>
#include <vector>

#include "weft/layout/layout.hpp"
#include "weft/layout/transition.hpp"

using namespace weft;

// Queries are constant expressions: these are checked by the compiler.
static_assert(Placement<Replicate> && Placement<Shard<-1>> && Placement<Partial> && !Placement<int>);
static_assert(is_sharded_on<Layout<Shard<0>, Replicate>, Axis::data>);
static_assert(!is_sharded_on<Layout<Shard<0>, Replicate>, Axis::tensor>);
static_assert(is_partial_on<TensorPartial, Axis::tensor> && is_replicated_on<TensorPartial, Axis::data>);
// The dual of a layout that context parallelism does not split is Partial on context (the addends
// of the context ranks, which hold the same value).
static_assert(std::is_same_v<dual_layout<Layout<Replicate, Shard<2>>>, Layout<Partial, Shard<2>, StageLocal, Partial>>);
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

// Three axes: the pipe axis is one more placement. Shrinking steps first (the pipe slice), growing
// last; StageLocal (the default on pipe) never turns into a spread over pipe.
using PipeSharded = Layout<Replicate, Shard<0>, Shard<1>>;  // (T/tp, C/pp) across pipe ranks
using PipeReplicated = Layout<Replicate, Replicate, Replicate>;
static_assert(Transition<PipeSharded, PipeReplicated>::possible);
static_assert(Transition<PipeSharded, PipeReplicated>::steps[0].collective == Collective::all_gather);
static_assert(Transition<Layout<Replicate, Shard<0>, Replicate>, Layout<Replicate, Replicate, Shard<0>>>::steps[0]
                  .axis == Axis::tensor);  // gathering dim 0 over tensor must come before slicing it over pipe
static_assert(Transition<Layout<Replicate, Shard<0>, Replicate>, Layout<Replicate, Replicate, Shard<0>>>::steps[1]
                  .axis == Axis::pipe);
static_assert(Transition<Replicated, Layout<Replicate, Shard<0>, Replicate>>::crosses_stages);
static_assert(!Transition<Replicated, Layout<Replicate, Shard<0>, Replicate>>::possible);
static_assert(
    std::is_same_v<dual_layout<Layout<Replicate, Shard<2>, Replicate>>, Layout<Partial, Shard<2>, Partial, Partial>>);
static_assert(std::is_same_v<placement_on<Replicated, Axis::pipe>, StageLocal>);

// Four axes: context is one more placement, defaulted to Replicate (a layout written without it is
// whole on every context rank), between pipe and tensor in mesh order.
using ContextSeq = Layout<Shard<0>, Replicate, StageLocal, Shard<1>>;   // (B/dp, T/cp, C): context parallelism
using ContextSeqTp = Layout<Shard<0>, Shard<2>, StageLocal, Shard<1>>;  // and C split over tensor
static_assert(std::is_same_v<placement_on<Replicated, Axis::context>, Replicate>);
static_assert(is_sharded_on<ContextSeq, Axis::context> && !is_sharded_on<ContextSeq, Axis::tensor>);
static_assert(kAxes[2] == Axis::context && kAxes.size() == 5 && kWorldAxes.size() == 4);
static_assert(collective_on<ContextSeq, DataSharded<0>, Axis::context> == Collective::all_gather);
static_assert(collective_on<DataSharded<0>, ContextSeq, Axis::context> == Collective::slice);
static_assert(collective_on<Layout<Replicate, Replicate, StageLocal, Partial>, Replicated, Axis::context> ==
              Collective::all_reduce);
static_assert(Transition<ContextSeqTp, DataSharded<0>>::steps[0].collective == Collective::all_gather);
static_assert(Transition<ContextSeqTp, DataSharded<0>>::steps[0].axis == Axis::context);  // mesh order among equals
static_assert(Transition<ContextSeqTp, DataSharded<0>>::steps[1].axis == Axis::tensor);
// The sequence moving from the tensor axis (sequence parallelism) to context: the slice first.
static_assert(Transition<Layout<Shard<0>, Shard<1>>, ContextSeq>::possible);
static_assert(Transition<Layout<Shard<0>, Shard<1>>, ContextSeq>::steps[0].axis == Axis::tensor);
static_assert(!has_partial<ContextSeq> && has_partial<Layout<Replicate, Replicate, StageLocal, Partial>>);

// The expert axis (carved from data x context, comm/mesh.hpp): only expert weights are placed on it.
using Experts = ExpertSharded<>;  // (E, ...): experts split over the expert group
static_assert(kAxes[4] == Axis::expert && is_sharded_on<Experts, Axis::expert>);
static_assert(std::is_same_v<placement_on<Replicated, Axis::expert>, Replicate>);
static_assert(std::is_same_v<dual_layout<Experts>, Layout<Partial, Partial, StageLocal, Partial, Shard<0>>>);
static_assert(std::is_same_v<dual_layout<Replicated>, Layout<Partial, Partial, StageLocal, Partial>>);
static_assert(collective_on<Experts, Replicated, Axis::expert> == Collective::all_gather);
static_assert(collective_on<Experts, Replicated, Axis::data> == Collective::none);

TEST_CASE("the expert axis: local shapes, boxes, names") {
  const Spread s{.data_degree = 4, .data_index = 3, .expert_degree = 2, .expert_index = 1};
  CHECK(s.degree(Axis::expert) == 2);
  CHECK(s.index(Axis::expert) == 1);
  CHECK(local_shape<Experts>({8, 6, 4}, s) == Shape{4, 6, 4});
  CHECK(local_box<Experts>({8, 6, 4}, s).offset == Shape{4, 0, 0});
  CHECK(local_box<ExpertSharded<Shard<1>>>(
            {8, 6, 4}, {.tensor_degree = 3, .tensor_index = 2, .expert_degree = 2, .expert_index = 1})
            .offset == Shape{4, 4, 0});
  CHECK(Experts::name() == "Layout<Replicate, Replicate, StageLocal, Replicate, Shard<0>>");
  CHECK(std::string(name(Axis::expert)) == "expert");
  CHECK_THROWS_WITH_AS(local_shape<Experts>({6, 2}, {.expert_degree = 4}),
                       "Layout<Replicate, Replicate, StageLocal, Replicate, Shard<0>>: dim 0 of shape (6, 2) has "
                       "extent 6, not divisible by the expert degree 4; choose a degree that divides the extent, or "
                       "pad the tensor",
                       Error);
}

TEST_CASE("the context axis: local shapes, boxes, names") {
  const Spread s{.data_degree = 2,
                 .tensor_degree = 2,
                 .data_index = 1,
                 .tensor_index = 1,
                 .context_degree = 4,
                 .context_index = 3};
  CHECK(s.degree(Axis::context) == 4);
  CHECK(s.index(Axis::context) == 3);
  CHECK(local_shape<ContextSeq>({4, 64, 8}, s) == Shape{2, 16, 8});
  CHECK(local_shape<ContextSeqTp>({4, 64, 8}, s) == Shape{2, 16, 4});
  const Box b = local_box<ContextSeqTp>({4, 64, 8}, s);
  CHECK(b.offset == Shape{2, 48, 4});
  CHECK(b.extent == Shape{2, 16, 4});
  CHECK_THROWS_WITH_AS(
      local_shape<ContextSeq>({4, 30, 8}, s),
      "Layout<Shard<0>, Replicate, StageLocal, Shard<1>>: dim 1 of shape (4, 30, 8) has extent 30, not "
      "divisible by the context degree 4; choose a degree that divides the extent, or pad the tensor",
      Error);
  // One dim on two axes, spelled apart so that only the run-time check sees it.
  CHECK_THROWS_WITH_AS((local_shape<Layout<Shard<-2>, Replicate, StageLocal, Shard<1>>>({4, 64, 8}, s)),
                       doctest::Contains("the data and context axes both shard dim 1"), Error);
  CHECK(ContextSeq::name() == "Layout<Shard<0>, Replicate, StageLocal, Shard<1>>");
  CHECK(Layout<Replicate, Replicate, Replicate, Partial>::name() == "Layout<Replicate, Replicate, Replicate, Partial>");
  CHECK(Layout<Shard<0>, Replicate>::name() == "Layout<Shard<0>, Replicate>");  // unchanged without context
}

// Sequence parallelism inside context parallelism: context and tensor both shard the sequence,
// context outer. Redistributions on the tensor axis alone (the rank's rows gathered or scattered)
// are possible; one that moves the context axis with the rows split over tensor anywhere on its way
// is refused (it goes through Rows, explicitly).
using RowsSp = Layout<Shard<0>, Shard<1>, StageLocal, Shard<1>>;
static_assert(Transition<RowsSp, ContextSeq>::possible);
static_assert(Transition<RowsSp, ContextSeq>::steps[0].collective == Collective::all_gather);
static_assert(Transition<RowsSp, ContextSeq>::steps[0].axis == Axis::tensor);
static_assert(Transition<Layout<Shard<0>, Partial, StageLocal, Shard<1>>, RowsSp>::possible);
static_assert(!Transition<RowsSp, Layout<Shard<0>, Shard<1>>>::possible);
static_assert(!Transition<RowsSp, DataSharded<0>>::possible);

TEST_CASE("context and tensor nest on one dim: local shapes and boxes tile the sequence, context outer") {
  // 2 context x 3 tensor ranks over a sequence of 12: context rank c holds rows 6c .. 6c + 5 (its
  // chunks, in the layout's order), tensor rank t of it rows 6c + 2t .. 6c + 2t + 1.
  std::vector<int> covered(12, 0);
  for (int c = 0; c < 2; ++c)
    for (int t = 0; t < 3; ++t) {
      const Spread s{.tensor_degree = 3, .tensor_index = t, .context_degree = 2, .context_index = c};
      CHECK(local_shape<RowsSp>({2, 12, 4}, s) == Shape{2, 2, 4});
      const Box b = local_box<RowsSp>({2, 12, 4}, s);
      CHECK(b.offset == Shape{0, 6 * c + 2 * t, 0});
      for (std::int64_t i = 0; i < b.extent[1]; ++i) ++covered[static_cast<std::size_t>(b.offset[1] + i)];
    }
  for (int n : covered) CHECK(n == 1);
  // The tensor degree must divide a context rank's rows, not only the sequence.
  CHECK_THROWS_WITH_AS(local_shape<RowsSp>({2, 12, 4}, {.tensor_degree = 4, .context_degree = 2}),
                       doctest::Contains("extent 6 on each context rank, not divisible by the tensor degree 4"), Error);
  const Redistribution p = redistribution<RowsSp, ContextSeq>({2, 12, 4}, {.tensor_degree = 3, .context_degree = 2}, 8);
  REQUIRE(p.count == 1);
  CHECK(p.steps[0].local_in == Shape{2, 2, 4});
  CHECK(p.steps[0].local_out == Shape{2, 6, 4});
}

TEST_CASE("local_shape divides each sharded dim by its axis degree") {
  const Spread s{.data_degree = 2, .tensor_degree = 3};
  CHECK(local_shape<Layout<Shard<0>, Shard<-1>>>({8, 5, 6}, s) == Shape{4, 5, 2});
  CHECK(local_shape<Layout<Partial, Shard<1>>>({8, 6}, s) == Shape{8, 2});
  CHECK(local_shape<Replicated>({8, 6}, s) == Shape{8, 6});
  static_assert(local_shape<Layout<Shard<0>, Shard<-1>>>({8, 6}, {.data_degree = 2, .tensor_degree = 3}) ==
                Shape{4, 2});
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
  CHECK(Layout<Shard<0>, Partial, Shard<1>>::name() == "Layout<Shard<0>, Partial, Shard<1>>");
}

TEST_CASE("the pipe axis is an axis like the others: local shapes, boxes, and one dim on one axis") {
  const Spread s{
      .data_degree = 2, .tensor_degree = 3, .data_index = 1, .tensor_index = 2, .pipe_degree = 2, .pipe_index = 1};
  using L = Layout<Shard<0>, Shard<2>, Shard<1>>;
  CHECK(local_shape<L>({4, 6, 9}, s) == Shape{2, 3, 3});
  const Box b = local_box<L>({4, 6, 9}, s);
  CHECK(b.offset == Shape{2, 3, 6});
  CHECK_THROWS_WITH_AS((local_shape<Layout<Replicate, Shard<1>, Shard<-1>>>({4, 6}, s)),
                       doctest::Contains("the pipe and tensor axes both shard dim 1"), Error);
  CHECK_THROWS_WITH_AS((local_shape<Layout<Replicate, Replicate, Shard<0>>>({5, 6}, s)),
                       doctest::Contains("extent 5, not divisible by the pipe degree 2"), Error);
}

namespace {
// Counts, for every element of a (6, 4, 6) tensor, how many ranks' boxes under L hold it, on a mesh
// of data dd x tensor td.
template <LayoutType L>
std::vector<int> coverage(int dd, int td) {
  const Shape g{6, 4, 6};
  std::vector<int> hits(static_cast<std::size_t>(g.numel()), 0);
  for (int di = 0; di < dd; ++di)
    for (int ti = 0; ti < td; ++ti) {
      const Box b = local_box<L>(g, {.data_degree = dd, .tensor_degree = td, .data_index = di, .tensor_index = ti});
      CHECK(b.extent == local_shape<L>(g, {.data_degree = dd, .tensor_degree = td}));
      for (std::int64_t i = 0; i < b.extent[0]; ++i)
        for (std::int64_t j = 0; j < b.extent[1]; ++j)
          for (std::int64_t k = 0; k < b.extent[2]; ++k)
            ++hits[static_cast<std::size_t>(((b.offset[0] + i) * g[1] + b.offset[1] + j) * g[2] + b.offset[2] + k)];
    }
  return hits;
}
}  // namespace

TEST_CASE("local_box: the ranks' boxes tile the global tensor, once per replica") {
  for (auto [dd, td] : {std::pair{1, 1}, {2, 1}, {1, 2}, {2, 2}, {3, 2}}) {
    // Sharded on both axes: each element held by exactly one rank.
    for (int h : coverage<Layout<Shard<0>, Shard<-1>>>(dd, td)) CHECK(h == 1);
    for (int h : coverage<Layout<Shard<2>, Shard<1>>>(dd, td)) CHECK(h == 1);
    // Sharded on one axis: once per rank of the other (replicated) axis.
    for (int h : coverage<Layout<Shard<0>, Replicate>>(dd, td)) CHECK(h == td);
    for (int h : coverage<Layout<Replicate, Shard<1>>>(dd, td)) CHECK(h == dd);
    // Replicated everywhere: every rank holds the whole box.
    for (int h : coverage<Replicated>(dd, td)) CHECK(h == dd * td);
  }
  const Box b = local_box<Layout<Shard<0>, Shard<-1>>>(
      {8, 6}, {.data_degree = 2, .tensor_degree = 3, .data_index = 1, .tensor_index = 2});
  CHECK(b.offset == Shape{4, 4});  // the worked example of layout.hpp
  CHECK(b.extent == Shape{4, 2});
}
