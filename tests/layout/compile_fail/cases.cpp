// Negative-compile cases for every static_assert of the layout part. tests/CMakeLists.txt compiles
// this file once per WEFT_CF_* macro and expects the compiler to fail with the assertion's text
// (cmake/WeftCompileFail.cmake); with no macro it must compile, which keeps the cases honest.
#include "weft/comm/mesh.hpp"
#include "weft/comm/redistribute.hpp"
#include "weft/comm/threads/thread_comm.hpp"
#include "weft/device/host/host.hpp"
#include "weft/layout/transition.hpp"

using namespace weft;
using M = Mesh<threads::ThreadComm>;

template <class L>
using T = Tensor<float, L, Host>;

[[maybe_unused]] void cases(M& mesh, Host& h) {
  [[maybe_unused]] const Spread s = mesh.spread();
#if defined(WEFT_CF_DATA_NOT_A_PLACEMENT)
  [[maybe_unused]] auto n = Layout<int, Replicate>::name();
#elif defined(WEFT_CF_TENSOR_NOT_A_PLACEMENT)
  [[maybe_unused]] auto n = Layout<Replicate, double>::name();
#elif defined(WEFT_CF_SAME_DIM_TWICE)
  [[maybe_unused]] auto n = Layout<Shard<1>, Shard<1> >::name();
#elif defined(WEFT_CF_CONTEXT_SAME_DIM)
  [[maybe_unused]] auto n = Layout<Shard<1>, Replicate, StageLocal, Shard<1> >::name();
#elif defined(WEFT_CF_CONTEXT_STEP_UNDER_NESTED)
  // Sequence parallelism inside context parallelism is a layout, but gathering over context while
  // tensor still splits each context rank's rows would interleave the wrong slices.
  auto x = T<Layout<Shard<0>, Shard<1>, StageLocal, Shard<1> > >::empty(h, {8, 8}, s);
  auto y = redistribute<Layout<Shard<0>, Shard<1> > >(x, mesh);
#elif defined(WEFT_CF_CONTEXT_STAGE_LOCAL)
  [[maybe_unused]] auto n = Layout<Replicate, Replicate, StageLocal, StageLocal>::name();
#elif defined(WEFT_CF_EXPERT_OVER_DATA_SHARD)
  // The expert groups are made of data x context ranks: a tensor split over data cannot also be.
  [[maybe_unused]] auto n = Layout<Shard<1>, Replicate, StageLocal, Replicate, Shard<0> >::name();
#elif defined(WEFT_CF_EXPERT_PARTIAL)
  [[maybe_unused]] auto n = Layout<Replicate, Replicate, StageLocal, Replicate, Partial>::name();
#elif defined(WEFT_CF_SHARD_TO_PARTIAL)
  auto x = T<Layout<Replicate, Shard<0> > >::empty(h, {8, 8}, s);
  auto y = redistribute<Layout<Replicate, Partial> >(x, mesh);
#elif defined(WEFT_CF_NO_VALID_ORDER)
  auto x = T<Layout<Shard<0>, Shard<1> > >::empty(h, {8, 8}, s);
  auto y = redistribute<Layout<Shard<1>, Shard<0> > >(x, mesh);
#elif defined(WEFT_CF_PLAN_NO_VALID_ORDER)
  [[maybe_unused]] auto p = redistribution<Layout<Shard<0>, Shard<1> >, Layout<Shard<1>, Shard<0> > >({8, 8}, s, 4);
#elif defined(WEFT_CF_CROSSES_STAGES)
  auto x = T<Replicated>::empty(h, {8, 8}, s);
  auto y = redistribute<Layout<Replicate, Replicate, Shard<0> > >(x, mesh);
#elif defined(WEFT_CF_TARGET_NOT_A_LAYOUT)
  auto x = T<Replicated>::empty(h, {8, 8}, s);
  auto y = redistribute<Shard<0> >(x, mesh);
#else
  // The control: valid uses of everything above compile.
  auto x = T<Layout<Shard<0>, Shard<1> > >::empty(h, {8, 8}, s);
  auto y = redistribute<Layout<Replicate, Partial> >(redistribute<Replicated>(x, mesh), mesh);
  auto z = redistribute_adjoint<Layout<Replicate, Shard<0> >, Replicated>(
      T<dual_layout<Replicated> >::empty(h, {8, 8}, s), mesh);
  [[maybe_unused]] auto p = redistribution<Layout<Shard<0>, Shard<1> >, Layout<Shard<1>, Replicate> >({8, 8}, s, 4);
#endif
}
