// Negative-compile cases for the nn part's static_asserts (see tests/layout/compile_fail/cases.cpp).
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
  Residual<Sequential<CopyToTensor, Col, Row>> r(std::move(s));
}
#else
// The control: the valid versions compile.
[[maybe_unused]] void f(Col a, Row b, Col c, Col d, Row e) {
  Sequential<Col, Row, Col> s(std::move(a), std::move(b), std::move(c));  // Row -> Col gets the all-reduce pair
  using Branch = Sequential<CopyToTensor, Col, Row, ReduceFromTensor>;
  Residual<Branch> r(Branch(CopyToTensor{}, std::move(d), std::move(e), ReduceFromTensor{}));
}
#endif
