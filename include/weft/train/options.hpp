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

namespace weft::train {

// The sizes a command line sets over a model family's preset (--layers, --heads, --width, --seq,
// --vocab); train::preset_config (train/family.hpp) applies them.
struct Sizes {
  std::optional<std::int64_t> layers, heads, width, seq, vocab, kv_heads, hidden;
  std::optional<bool> tied;  // --tie-embeddings: the LM head reads the embedding table
};

struct Options {
  std::string program = "train";  // the binary's name, where errors come from ("train_gpt")
  std::string model;              // the model family (--model); empty: the binary's first
  std::string preset = "tiny";
  bool preset_given = false;       // --preset was on the command line (with --init-from: sizes from the preset, not config.json)
  Sizes sizes;
  int data = 2, tensor = 2, pipe = 1, virtual_stages = 1;
  int context = 1;                 // --context: the sequence sharded over this many ranks
  std::string attention = "ring";  // --attention: ring or all-gather, with --context > 1
  bool attention_given = false;    // --attention was on the command line (refused without --context)
  std::string schedule = "1f1b";
  std::string strategy = "ddp";
  std::int64_t batch = 16, micro_batch = 0, steps = 600, eval_every = 100, sample = 0;
  std::optional<std::int64_t> warmup;  // default: 5% of the steps
  double lr = 3e-3, min_lr = 3e-4, clip = 1.0;
  std::uint64_t seed = 1;
  std::string data_file, text, dtype = "f32", log, device = "auto", trace;
  std::string save_dir, resume, save_policy = "sharded", init_from;
  std::int64_t save_every = 0;
  int keep = 0;
  bool async_save = false;
  std::string launcher = "auto";
  double deadline = 60;  // seconds any collective waits for the other ranks

  std::int64_t micro() const { return micro_batch > 0 ? micro_batch : batch; }  // the global micro-batch
  // --strategy: "zero1-sp" is ZeRO-1 with sequence parallelism; the one place the suffix is read.
  bool sequence_parallel() const { return strategy.ends_with("-sp"); }
  std::string base_strategy() const { return sequence_parallel() ? strategy.substr(0, strategy.size() - 3) : strategy; }
  int ranks() const { return data * pipe * context * tensor; }
  MeshShape mesh() const { return {.data = data, .pipe = pipe, .context = context, .tensor = tensor}; }
  // "data 2 x pipe 1 x tensor 2" (" x context 2" before tensor where context > 1).
  std::string mesh_text() const {
    return cat("data ", data, " x pipe ", pipe, context > 1 ? cat(" x context ", context) : std::string(), " x tensor ", tensor);
  }
  // "<program> <option>": where an error about an option comes from.
  std::string where(const std::string& option = {}) const { return option.empty() ? program : program + " " + option; }
};

// How this process runs the ranks: all of them as threads, or one as a process of mpirun (or, on
// GPUs, of a launcher that sets RANK and WORLD_SIZE).
struct Launch {
  Launcher kind = Launcher::threads;
  int process = 0, processes = 1;  // this process among the processes (0 of 1 with threads)
  int gpu = 0;                     // the launcher's local rank: the GPU of this process (modulo the GPUs)
  std::function<void()> barrier;   // all processes (MPI_Barrier); empty with threads and env
  bool lead() const { return process == 0; }  // prints and writes the log
};

inline std::chrono::milliseconds deadline_of(const Options& o) {
  return std::chrono::milliseconds(static_cast<std::int64_t>(o.deadline * 1000));
}

}  // namespace weft::train
