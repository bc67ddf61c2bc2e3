// train_gpt's GPU half (nvcc): the training loop for GPT-2 on the GPU (weft/train/devices.cuh),
// every strategy in f32 and bf16 mixed precision. Built into train_gpt in CUDA builds; the command
// line (weft/train/main.hpp) calls it for --device cuda.
#include "weft/train/devices.cuh"

#include "train_gpt_family.hpp"

template int weft::train::train_on_cuda<TrainGpt2>(const weft::train::Options&, const weft::gpt2::Config&,
                                                   const weft::train::Corpus&, const weft::train::Launch&);
