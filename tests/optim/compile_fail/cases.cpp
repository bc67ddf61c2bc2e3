// Negative-compile cases for the static_asserts of the data-parallel layouts, the parameters' gradient
// layouts and the host GEMM (see tests/layout/compile_fail/cases.cpp for how they run).
#include "weft/comm/mesh.hpp"
#include "weft/comm/threads/thread_comm.hpp"
#include "weft/device/host/gemm.hpp"
#include "weft/optim/data_parallel.hpp"

using namespace weft;

[[maybe_unused]] void cases() {
#if defined(WEFT_CF_DATA_PLACEMENT)
  [[maybe_unused]] optim::DataLayout<Shard<1>, Shard<0>, Shard<0>> s;
#elif defined(WEFT_CF_PARAMS_WITHOUT_GRADS)
  [[maybe_unused]] optim::DataLayout<Shard<0>, Replicate, Shard<0>> s;
#elif defined(WEFT_CF_GRADS_WITHOUT_STATE)
  [[maybe_unused]] optim::DataLayout<Replicate, Shard<0>, Replicate> s;
#elif defined(WEFT_CF_GRAD_LAYOUT)
  [[maybe_unused]] nn::Param<double, Replicated, Layout<Replicate, Shard<0>>> p;
#elif defined(WEFT_CF_GEMM_TYPE)
  int a = 0;
  host::gemm<int>(host::Trans::no, host::Trans::no, 1, 1, 1, 1, &a, 1, &a, 1, 0, &a, 1);
#else
  [[maybe_unused]] optim::Ddp ddp;
  [[maybe_unused]] optim::Zero1 z1;
  [[maybe_unused]] optim::Zero2 z2;
  [[maybe_unused]] optim::Fsdp fsdp;
  [[maybe_unused]] nn::Param<double, Replicated, Layout<Replicate, Partial>> p;
  double a = 0;
  host::gemm<double>(host::Trans::no, host::Trans::no, 1, 1, 1, 1, &a, 1, &a, 1, 0, &a, 1);
#endif
}
