// Reshard round trips over the data strategies and the tensor degree (reshard.hpp says what each
// checks): DDP <-> ZeRO-1 <-> ZeRO-2 <-> FSDP, data 1 <-> 2 <-> 4, tensor 1 <-> 2 <-> 4, the
// consolidated policy once.
#include "checkpoint/reshard.hpp"

using namespace weft;
using namespace weft::test;
using optim::Ddp, optim::Zero1, optim::Zero2, optim::Fsdp;

TEST_CASE("reshard round trips: strategies, data and tensor degrees") {
  round_trip(config<float, Ddp>("ddp_d2", {.data = 2}), config<float, Zero1>("zero1_t2", {.tensor = 2}));
  round_trip(config<float, Ddp>("ddp_d2t2", {.data = 2, .tensor = 2}), config<float, Fsdp>("fsdp_d4", {.data = 4}));
  round_trip(config<float, Zero1>("zero1_d2t2", {.data = 2, .tensor = 2}),
             config<float, Zero2>("zero2_t4", {.tensor = 4}));
  round_trip(config<float, Zero2>("zero2_d4", {.data = 4}), config<float, Fsdp>("fsdp_d2t2", {.data = 2, .tensor = 2}));
  round_trip(config<float, Fsdp>("fsdp_d2", {.data = 2}), config<float, Ddp>("ddp_d1", {}));
  round_trip(config<float, Ddp>("ddp_t4", {.tensor = 4}), config<float, Zero1>("zero1_d4", {.data = 4}));
  round_trip(config<float, Zero2>("zero2_d2t2", {.data = 2, .tensor = 2}),
             config<float, Zero2, false, checkpoint::Consolidated>("zero2_d4_consolidated", {.data = 4}));
}
