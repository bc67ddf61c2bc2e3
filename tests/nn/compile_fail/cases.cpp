// Negative-compile cases for the nn part's static_asserts (see tests/layout/compile_fail/cases.cpp).
#include "weft/nn/either.hpp"
#include "weft/nn/modulation.hpp"
#include "weft/nn/sequential.hpp"

using namespace weft;
using namespace weft::nn;

using Col = Linear<double, ColumnParallel>;
using Row = Linear<double, RowParallel>;

#if defined(WEFT_CF_ROW_INTO_ROW)
[[maybe_unused]] void f(Row a, Row b) { Sequential<Row, Row> s(std::move(a), std::move(b)); }
#elif defined(WEFT_CF_ROW_GELU)
[[maybe_unused]] void f() { Linear<double, RowParallel, epilogue::Gelu> l; }
#elif defined(WEFT_CF_UNKNOWN_EPILOGUE)
[[maybe_unused]] void f() { Linear<double, ColumnParallel, int> l; }
#elif defined(WEFT_CF_RESIDUAL_ENDS_PARTIAL)
[[maybe_unused]] void f(Sequential<CopyToTensor, Col, Row> s) {
  Residual<Sequential<CopyToTensor, Col, Row> > r(std::move(s));
}
#elif defined(WEFT_CF_EITHER_LAYOUTS)
// Either's two layers must agree on their layouts: a branch that ends Partial against one that ends
// Replicate.
[[maybe_unused]] void f(Sequential<CopyToTensor, Col, Row, ReduceFromTensor> a, Sequential<CopyToTensor, Col, Row> b) {
  [[maybe_unused]] Either<Sequential<CopyToTensor, Col, Row, ReduceFromTensor>, Sequential<CopyToTensor, Col, Row> > e(
      std::move(a));
}
#elif defined(WEFT_CF_LAYER_WITHOUT_OUT_SHAPE) || defined(WEFT_CF_LAYER_WITHOUT_CTX)
// A user's layer that misses a member of nn::Layer (layer.hpp) is refused where it is named, not
// deep inside Sequential when a member of it is first called.
struct UsersLayer {
  using In = Col::Out;
  using Out = Col::Out;
  using GradIn = Col::GradOut;
  using GradOut = Col::GradOut;
#if !defined(WEFT_CF_LAYER_WITHOUT_CTX)
  struct Ctx {};
#endif
#if !defined(WEFT_CF_LAYER_WITHOUT_OUT_SHAPE)
  Shape out_shape(const Shape& s) const { return s; }
#endif
  static std::string name() { return "UsersLayer"; }
  template <class F>
  void for_each_param(const std::string&, F&&) {}
};
#if defined(WEFT_CF_IN_SEQUENTIAL)
using UsersModel = Sequential<Col, UsersLayer>;  // where Sequential names it
#else
static_assert(Layer<UsersLayer>);  // at its declaration
#endif
#elif defined(WEFT_CF_SIDE_WITHOUT_PRODUCER)
// A layer that reads the side input, run with a plain mesh: no stage produced one.
#include "weft/comm/threads/run.hpp"
struct PlainMesh {
  ThreadComm& comm(Axis);
};
[[maybe_unused]] void f(Modulation<double, act::Full>& m, Modulation<double, act::Full>::Ctx& c,
                        const Tensor<double, act::Full, Host>& x, PlainMesh& mesh) {
  m.forward(c, x, mesh);
}
#elif defined(WEFT_CF_HEAD_CANNOT_REDUCE)
// A model whose sequence is split over context ranks (Cx = Ring) with a head built for whole
// sequences (MseHeadStage without the context choice): its loss cannot be reduced over the layout.
#include "weft/nn/feature_stages.hpp"
#include "weft/nn/token_wise.hpp"
struct In {
  std::span<const double> x, y;
  template <class F>
  void for_each_field(F&& f) {
    f("x", x), f("y", y);
  }
  template <class C>
  void check(const C&, std::int64_t, const std::string&) const {}
};
struct Cfg {
  std::int64_t seq = 8, layers = 1, width = 8;
  std::uint64_t seed = 1;
};
struct Spec {
  using precision = precision_t<F64>;
  using config = Cfg;
  using device = Host;
  using Inputs = In;
  using A = stream<false, true>::layout;
  using Block = TokenWise<LayerNorm<double, stream<false>::layout> >;
  using Embedding = FeatureEmbeddingStage<double, false, &In::x, Host, context::Ring>;
  using Head = MseHeadStage<double, false, &In::y>;  // whole sequences: no context choice
  static constexpr bool sequence_parallel = false;
  static std::string name() { return "cf"; }
  static void validate(const Cfg&, const Spread&, std::int64_t) {}
  static std::vector<std::pair<std::string, std::int64_t> > record(const Cfg&) { return {}; }
  static std::string block_name(std::int64_t) { return "b"; }
  static Embedding make_embedding(Host&, const Cfg&, const Spread&);
  static Block make_block(Host&, const Cfg&, const Spread&, std::int64_t);
  static Head make_head(Host&, const Cfg&, const Spread&);
};
[[maybe_unused]] StagedModel<Spec>* model = nullptr;
[[maybe_unused]] constexpr bool sided = StagedModel<Spec>::sided;
#else
// The control: the valid versions compile.
static_assert(Layer<Col> && Layer<Row> && Layer<CopyToTensor> && Layer<Sequential<Col, Row> >);
[[maybe_unused]] void f(Col a, Row b, Col c, Col d, Row e) {
  Sequential<Col, Row, Col> s(std::move(a), std::move(b), std::move(c));  // Row -> Col gets the all-reduce pair
  using Branch = Sequential<CopyToTensor, Col, Row, ReduceFromTensor>;
  Residual<Branch> r(Branch(CopyToTensor{}, std::move(d), std::move(e), ReduceFromTensor{}));
}
#endif
