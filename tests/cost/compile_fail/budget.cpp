// A memory budget checked by the compiler: GPT-2 124M's persistent state in bf16 mixed precision is
// 18 bytes per parameter under DDP (2.2 GB a rank), an eighth of that under FSDP on 8 data ranks.
// Without a define this compiles; with WEFT_CF_DDP_OVER_BUDGET the 1 GiB budget refuses DDP.
#include "weft/cost/memory.hpp"
#include "weft/models/gpt2/footprint.hpp"

using namespace weft;

namespace {
constexpr gpt2::Config kGpt2{.vocab = 50257, .seq = 1024, .layers = 12, .heads = 12, .width = 768};
constexpr Spread kEight{.data_degree = 8, .tensor_degree = 1};
constexpr std::int64_t kBudget = std::int64_t{1} << 30;
static_assert(footprint::fits<optim::Fsdp, Bf16Mixed>(kGpt2, kEight, footprint::Holds::all(kGpt2), kBudget),
              "plan: GPT-2 124M under FSDP on 8 ranks does not fit 1 GiB per rank");
#if defined(WEFT_CF_DDP_OVER_BUDGET)
static_assert(footprint::fits<optim::Ddp, Bf16Mixed>(kGpt2, kEight, footprint::Holds::all(kGpt2), kBudget),
              "plan: GPT-2 124M under DDP does not fit 1 GiB per rank; shard it (Zero1, Zero2, Fsdp)");
#endif
}  // namespace
