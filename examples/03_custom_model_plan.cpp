// weft-plan for the decoder of 03_custom_model.hpp, from weft's trainer library: every layout of a
// cluster ranked by step time among those that fit, each costed by measuring the step of its
// bounding ranks on the Meta device (plan/search.hpp; exact to the host allocator's byte, on
// meshes of any size, nothing allocated).
//
//   custom_model_plan --gpus 64 --batch 256 --micro 2
//   custom_model_plan --gpus 4096 --batch 4096 --layers 32 --width 2048 --heads 16 --seq 2048 --json
#include "03_custom_model_family.hpp"

#include <weft/plan/search.hpp>

int main(int argc, char** argv) { return weft::train::plan_main<custom::Family>(argc, argv, "custom_model_plan"); }
