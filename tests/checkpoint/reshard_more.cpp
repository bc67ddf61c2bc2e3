// Reshard round trips with sequence parallelism, across precisions (f32 <-> bf16 with f32 master
// weights, f32 <-> f64) and across pipeline degrees (pipe 1 <-> 2); reshard.hpp says what each checks.
#include "checkpoint/reshard.hpp"

using namespace weft;
using namespace weft::test;
using optim::Ddp, optim::Zero1, optim::Zero2, optim::Fsdp;

TEST_CASE("reshard round trips: sequence parallelism") {
  round_trip(config<float, Ddp, true>("ddp_sp_d2t2", {.data = 2, .tensor = 2}),
             config<float, Fsdp>("fsdp_d2", {.data = 2}));
  round_trip(config<float, Zero2, true>("zero2_sp_t2", {.tensor = 2}),
             config<float, Ddp>("ddp_d2t2", {.data = 2, .tensor = 2}));
  round_trip(config<float, Fsdp, true>("fsdp_sp_d2t2", {.data = 2, .tensor = 2}),
             config<float, Zero1, true>("zero1_sp_t4", {.tensor = 4}));
}

TEST_CASE("reshard round trips: precisions") {
  round_trip(config<float, Ddp>("ddp_f32_d2", {.data = 2}),
             config<Bf16Mixed, Ddp>("ddp_bf16_d2t2", {.data = 2, .tensor = 2}));
  round_trip(config<float, Zero1>("zero1_f32_t2", {.tensor = 2}), config<Bf16Mixed, Fsdp>("fsdp_bf16_d2", {.data = 2}));
  round_trip(config<float, Ddp>("ddp_f32_d1", {}), config<double, Zero1>("zero1_f64_d2", {.data = 2}));
}

TEST_CASE("reshard round trips: pipeline degrees") {
  round_trip(config<float, Zero1>("zero1_d2", {.data = 2}), config<float, Ddp>("ddp_p2", {.pipe = 2}));
  round_trip(config<float, Fsdp>("fsdp_d2t2", {.data = 2, .tensor = 2}),
             config<float, Fsdp>("fsdp_d2p2", {.data = 2, .pipe = 2}));
  round_trip(config<float, Zero2>("zero2_d2", {.data = 2}),
             config<float, Ddp, true>("ddp_sp_t2p2", {.tensor = 2, .pipe = 2}));
}
