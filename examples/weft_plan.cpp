// weft-plan: the plan of a model on any number of GPUs, from a small cluster description, for every
// strategy this binary was compiled with (DDP, ZeRO-1, ZeRO-2, FSDP, each with and without sequence
// parallelism, without or with full recompute), every tensor degree that fits in a node, and
// pipelines (1F1B, ZB-H1 and interleaved 1F1B with 2 virtual stages over every pipe degree that
// divides the layers and the GPUs); ranked by step time among those that fit in memory. Nothing is
// allocated and no GPU is needed.
//
//   weft-plan --preset gpt2-124m --gpus 1024 --batch 512 --micro 4
//   weft-plan --cluster cluster.json --layers 48 --width 6144 --heads 48 --seq 2048 --gpus 4096 --batch 2048
//
// The search and the command line are weft's trainer library (plan/search.hpp), over the
// families examples/CMakeLists.txt lists (weft_add_family_program; --model gpt2, the default,
// llama, mixtral or qwen3-moe). GPT-2 is costed by its closed forms
// (models/gpt2/cluster_plan.hpp): per candidate the peak bytes of a step on one rank (models/gpt2/replay.hpp,
// the host allocator's counts, plus the CUDA back end's workspace estimate) and the step time
// (models/gpt2/estimate.hpp) at rates derived from the cluster: GEMMs and the attention core at a fraction of
// the peak FLOP/s, elementwise ops at the HBM bandwidth, tensor-parallel collectives on the
// intra-node link, data collectives on the inter-node link once the data group leaves the node. No
// overlap (weft's executors run collectives and compute in turn). A pipeline's memory is the
// largest pipe rank's replay of the schedule's table, its time estimate::pipeline_seconds; its
// parts are the pipe-1 parts over the pipe degree, plus `pipeline`: the schedule's idle time, its
// messages and the ranks' imbalance. A family without closed forms, Llama's here, is planned by
// measuring its step on the Meta device (as examples/03_custom_model_plan.cpp does for its model):
//
//   weft-plan --model llama --gpus 1024 --batch 1024 --micro 1          (Llama 3.1 8B, the default)
//   weft-plan --model llama --preset llama-3.1-70b --gpus 4096 --batch 2048
//
// The mixtures of experts (--model mixtral, Mixtral 8x7B by default; --model qwen3-moe,
// Qwen3-30B-A3B) the same way, each layout with every expert degree carved from its data ranks:
//
//   weft-plan --model mixtral --seq 1024 --gpus 8 --batch 8 --micro 1
#include <weft/plan/search.hpp>

#include "weft_families.hpp"  // generated: weft_units::families

int main(int argc, char** argv) { return weft::train::plan_main_of(weft_units::families{}, argc, argv, "weft-plan"); }
