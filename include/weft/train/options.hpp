// What a training run is asked to do (train::Options: the trainer's command line, docs/training.md)
// and how its process runs the ranks (train::Launch). The loop (train/loop.hpp) and the command line
// (train/main.hpp) read these for any model.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "weft/comm/launch.hpp"
#include "weft/comm/mesh.hpp"
#include "weft/core/error.hpp"
#include "weft/train/sizes.hpp"

namespace weft::train {

// The run's options by section, each the concern of one part: the model (the family, its size,
// the precision, the seed), the mesh (the degrees, the pipeline schedule, the data strategy), the
// optimization, the data, the checkpoints, the logs, and how the ranks are launched.

struct ModelOptions {
  std::string family;  // --model; empty: the binary's first
  std::string preset = "tiny";
  // --preset was on the command line (with --init-from: sizes from the preset, not config.json)
  bool preset_given = false;
  Sizes sizes;
  std::string dtype = "f32";
  std::uint64_t seed = 1;  // the weights' and the built-in corpus's
};

struct MeshOptions {
  int data = 2, tensor = 2, pipe = 1, virtual_stages = 1;
  int context = 1;                 // --context: the sequence sharded over this many ranks
  int expert = 1;                  // --expert: experts sharded over groups of this many data x context ranks
  std::string attention = "ring";  // --attention: ring or all-gather, with --context > 1
  bool attention_given = false;    // --attention was on the command line (refused without --context)
  std::string schedule = "1f1b";
  std::string strategy = "ddp";  // "zero1-sp": ZeRO-1 with sequence parallelism

  int ranks() const { return data * pipe * context * tensor; }
  MeshShape shape() const {
    return {.data = data, .pipe = pipe, .context = context, .tensor = tensor, .expert = expert};
  }
  // "data 2 x pipe 1 x tensor 2" (" x context 2" before tensor where context > 1; ", expert 2" after
  // it where expert > 1: the expert groups are carved from the data x context ranks, not more ranks).
  std::string text() const {
    return cat("data ", data, " x pipe ", pipe, context > 1 ? cat(" x context ", context) : std::string(), " x tensor ",
               tensor, expert > 1 ? cat(", expert ", expert) : std::string());
  }
  // --strategy's -sp suffix: the one place it is read.
  bool sequence_parallel() const { return strategy.ends_with("-sp"); }
  std::string base_strategy() const { return sequence_parallel() ? strategy.substr(0, strategy.size() - 3) : strategy; }
};

struct OptimOptions {
  std::int64_t batch = 16, micro_batch = 0, steps = 600;
  std::optional<std::int64_t> warmup;  // default: 5% of the steps
  double lr = 3e-3, min_lr = 3e-4, clip = 1.0;

  std::int64_t micro() const { return micro_batch > 0 ? micro_batch : batch; }  // the global micro-batch
};

struct DataOptions {
  std::string file, text;  // --data-file (llm.c tokens), --text (bytes); neither: the built-in corpus
  std::int64_t eval_every = 100, sample = 0;
  // A family that reads its own data (train::OwnsData: DiT): --records and --labels (record files,
  // data/records.hpp; neither: the family's synthetic data), --objective (ddpm or flow).
  std::string records, labels, objective = "ddpm";
};

struct CheckpointOptions {
  std::string save_dir, resume, save_policy = "sharded", init_from;
  std::int64_t save_every = 0;
  int keep = 0;
  bool async_save = false;
};

struct LoggingOptions {
  std::string log, trace;  // --log (JSON lines), --trace (Chrome / Perfetto)
};

struct LaunchOptions {
  std::string device = "auto", launcher = "auto";
  double deadline = 60;  // seconds any collective waits for the other ranks
};

struct Options {
  std::string program = "train";  // the binary's name, where errors come from ("weft-train")
  ModelOptions model;
  MeshOptions mesh;
  OptimOptions optim;
  DataOptions data;
  CheckpointOptions checkpoint;
  LoggingOptions logging;
  LaunchOptions launch;

  // "<program> <option>": where an error about an option comes from.
  std::string where(const std::string& option = {}) const { return option.empty() ? program : program + " " + option; }
};

// How this process runs the ranks: all of them as threads, or one as a process of mpirun (or, on
// GPUs, of a launcher that sets RANK and WORLD_SIZE).
struct Launch {
  Launcher kind = Launcher::threads;
  int process = 0, processes = 1;             // this process among the processes (0 of 1 with threads)
  int gpu = 0;                                // the launcher's local rank: the GPU of this process (modulo the GPUs)
  std::function<void()> barrier;              // all processes (MPI_Barrier); empty with threads and env
  bool lead() const { return process == 0; }  // prints and writes the log
};

inline std::chrono::milliseconds deadline_of(const LaunchOptions& o) {
  return std::chrono::milliseconds(static_cast<std::int64_t>(o.deadline * 1000));
}

}  // namespace weft::train
