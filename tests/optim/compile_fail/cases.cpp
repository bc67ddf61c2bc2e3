// Negative-compile cases for the static_asserts of the optimizers and the host GEMM
// (see tests/layout/compile_fail/cases.cpp for how they run).
#include "weft/comm/mesh.hpp"
#include "weft/comm/threads/thread_comm.hpp"
#include "weft/device/host/gemm.hpp"
#include "weft/optim/fsdp.hpp"
#include "weft/optim/zero.hpp"

using namespace weft;
using Model = nn::Gpt<double>;
using M = Mesh<threads::ThreadComm>;

[[maybe_unused]] void cases(Model& model, M& mesh) {
#if defined(WEFT_CF_ZERO_STAGE)
  optim::ZeroAdamW<Model, 2> z(model, {}, mesh);
#elif defined(WEFT_CF_SHARDED_STAGE)
  optim::Sharded<Model, M, 1> s(model, {}, mesh);
#elif defined(WEFT_CF_REDUCE_TYPE)
  optim::reduce_gradients<float>(model, mesh);
#elif defined(WEFT_CF_GEMM_TYPE)
  int a = 0;
  host::gemm<int>(host::Trans::no, host::Trans::no, 1, 1, 1, 1, &a, 1, &a, 1, 0, &a, 1);
#else
  optim::ZeroAdamW<Model, 1> z(model, {}, mesh);
  optim::Fsdp<Model, M> f(model, {}, mesh);
  optim::reduce_gradients<double>(model, mesh);
  double a = 0;
  host::gemm<double>(host::Trans::no, host::Trans::no, 1, 1, 1, 1, &a, 1, &a, 1, 0, &a, 1);
#endif
}
