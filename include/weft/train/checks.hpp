// The trainer's checks of its options, before anything is built (train/main.hpp calls them in this
// order): each throws a weft::Error naming the option and its values, which the command line turns
// into exit 2. The family-independent ones are plain functions; those that read a family's types are
// templates at the end. What the binary compiled (the family's variants, devices, strategies and
// precisions) is checked by the dispatch (train/dispatch.hpp).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>

#include "weft/checkpoint/checkpoint.hpp"
#include "weft/comm/launch.hpp"
#include "weft/context/attention.hpp"
#include "weft/data/synthetic.hpp"
#include "weft/nn/layer_walk.hpp"
#include "weft/optim/schedule.hpp"
#include "weft/pipeline/pipelined.hpp"
#include "weft/pipeline/schedule.hpp"
#include "weft/train/family.hpp"
#include "weft/train/options.hpp"
#include "weft/train/strategies.hpp"
#ifdef WEFT_ENABLE_CUDA
#include "weft/device/cuda/device.hpp"
#endif

namespace weft::train {

// A bad option found only once the run has begun reading (a checkpoint at or past --steps): exit 2
// like the others, where the errors around it are the run's (exit 1).
struct BadOption : Error {
  explicit BadOption(const Error& e) : Error(e) {}
};

// The device a run uses: --device, with auto meaning the GPU when one is present. Throws for a
// device this binary or machine does not have.
inline std::string resolve_device(const Options& o) {
#ifdef WEFT_ENABLE_CUDA
  const int gpus = weft::cuda::device_count();
  if (o.launch.device == "cuda" && gpus == 0)
    throw Error(o.where(), "--device cuda but no GPU was found (no CUDA device is visible, or no driver)",
                "run on a machine with an NVIDIA GPU, or use --device host");
  if (o.launch.device == "auto") return gpus > 0 ? "cuda" : "host";
#else
  if (o.launch.device == "cuda")
    throw Error(o.where(), "--device cuda but this binary was built without CUDA",
                "rebuild with a CUDA compiler (the cuda preset), or use --device host");
  if (o.launch.device == "auto") return "host";
#endif
  return o.launch.device;
}

// The mesh's size: in floating point first, since four int degrees multiply past 64 bits.
inline void check_world(const Options& o, const Launch& launch) {
  const double world = 1.0 * o.mesh.data * o.mesh.pipe * o.mesh.context * o.mesh.tensor;
  char text[64];
  std::snprintf(text, sizeof text, "%.0f", world);
  if (world > (1 << 20))
    throw Error(o.where(), cat(o.mesh.text(), " = ", text, " ranks"), "use at most 2^20 = 1048576 ranks");
  if (launch.kind == Launcher::threads && world > 1024)
    throw Error(o.where("--launcher threads"), cat(o.mesh.text(), " = ", text, " thread ranks in one process"),
                "use at most 1024 thread ranks, or one process per rank (mpirun, docs/launch.md)");
}

// A launcher of one process per rank (mpirun, or RANK and WORLD_SIZE from torchrun or srun) against
// the mesh and the device. Reads this process's rank and GPU from the environment for `env`.
inline void check_processes(const Options& o, Launch& launch, const std::string& device) {
  if (launch.kind == Launcher::env) {  // torchrun, srun: one GPU per process
    if (device != "cuda")
      throw Error(o.where("--launcher env"),
                  "RANK and WORLD_SIZE start one process per rank, which the host ranks do only under MPI",
                  "start the ranks with mpirun (--launcher mpi), use --device cuda, or unset RANK and WORLD_SIZE");
    const EnvRanks env = env_ranks();
    launch.process = env.rank;
    launch.processes = env.world;
    launch.gpu = env.local_rank;
  }
  if (launch.kind == Launcher::threads) return;
#ifndef WEFT_ENABLE_MPI
  if (launch.kind == Launcher::mpi)
    throw Error(o.where("--launcher mpi"), "this binary was built without MPI",
                "install Debian's libopenmpi-dev and rebuild (CMake finds MPI and builds weft::mpi)");
#endif
  const std::string where = o.where(cat("--launcher ", name(launch.kind)));
  const int ranks = o.mesh.ranks();
  const bool mpi = launch.kind == Launcher::mpi;
  if (launch.processes != ranks)
    throw Error(where,
                cat(mpi ? "mpirun started " : "WORLD_SIZE is ", launch.processes, mpi ? " processes" : "", " but ",
                    o.mesh.text(), " = ", ranks, " ranks"),
                cat(mpi ? cat("run mpirun -np ", ranks) : cat("start ", ranks, " processes"),
                    ", or choose degrees whose product is ", launch.processes));
  if (o.mesh.pipe > 1 && device == "cuda")
    throw Error(where, "--pipe with GPU processes (NCCL has no isend here yet)",
                "use --pipe on thread ranks (--launcher threads), or tensor and data parallelism across GPUs");
  if (!o.logging.trace.empty())
    throw Error(where, "--trace records thread ranks of one process", "trace a --launcher threads run");
}

// The micro-batch divides the batch.
inline void check_batch(const Options& o) {
  if (o.optim.batch % o.optim.micro() != 0)
    throw Error(o.where(), cat("batch ", o.optim.batch, " is not a multiple of the micro-batch ", o.optim.micro()),
                "use a micro-batch that divides the batch");
}

// The learning-rate schedule, the mesh and the pipeline's partition and table, for a model of
// `layers` layers.
inline void check_schedule(const Options& o, std::int64_t layers) {
  (void)optim::Schedule::warmup_cosine(o.optim.lr, o.optim.warmup.value_or(o.optim.steps / 20), o.optim.steps,
                                       o.optim.min_lr);
  validate(o.mesh.shape(), o.mesh.ranks());
  if (o.mesh.pipe == 1 && o.mesh.virtual_stages == 1) return;
  (void)pipeline::Partition::even(o.mesh.pipe, o.mesh.virtual_stages, layers);
  (void)pipeline::make_table(pipeline::kind_named(o.mesh.schedule), o.mesh.pipe,
                             static_cast<int>(o.optim.batch / o.optim.micro()), o.mesh.virtual_stages);
  if (o.mesh.pipe == 1)
    throw Error(o.where(), cat("--virtual-stages ", o.mesh.virtual_stages, " without --pipe"),
                "virtual stages split a pipeline's ranks: use --pipe >= 2");
  if (o.data.sample > 0)
    throw Error(o.where(), "--sample with --pipe", "sample from a run without pipeline parallelism");
}

// The data options against what the family reads: tokens (--data-file, --text, --sample), or data
// of its own (--records with --labels, --objective).
inline void check_inputs(const Options& o, const std::string& family, bool owns_data) {
  if (owns_data) {
    for (const auto& [given, option] :
         {std::pair{!o.data.file.empty(), "--data-file"}, std::pair{!o.data.text.empty(), "--text"},
          std::pair{o.data.sample > 0, "--sample"}})
      if (given)
        throw Error(o.where(option), cat("the model family '", family, "' reads no tokens"),
                    "give it --records and --labels, or nothing (its synthetic data)");
    if (!o.data.records.empty() && o.data.labels.empty())
      throw Error(o.where("--records"), "no --labels", "give the labels' record file too");
    return;
  }
  if (!o.data.records.empty() || o.data.objective != "ddpm")
    throw Error(o.where(o.data.records.empty() ? "--objective" : "--records"),
                cat("the model family '", family, "' reads tokens"), "use --data-file or --text");
}

// Sampling against the model's vocabulary.
inline void check_data(const Options& o, std::int64_t vocab) {
  if (!o.data.text.empty() && vocab < 256)
    throw Error(o.where(), cat("vocabulary ", vocab, " with --text"), "byte-level text needs a vocabulary of 256");
  if (o.data.sample > 0 && o.data.text.empty())
    throw Error(o.where(), "--sample without --text", "sampling prints text: train on --text");
}

// The corpus a training run reads, against the model's vocabulary (--plan reads none: a Llama 3
// vocabulary plans without a data file).
inline void check_corpus(const Options& o, std::int64_t vocab) {
  if (o.data.file.empty() && o.data.text.empty() && vocab > data::MarkovSource::max_vocab)
    throw Error(o.where(), cat("vocabulary ", vocab, " with the built-in Markov corpus"),
                cat("use at most ", data::MarkovSource::max_vocab, " tokens, or train on a --data-file"));
}

// The checkpoint options against each other.
inline void check_checkpoint_options(const Options& o) {
  if (!o.checkpoint.resume.empty() && !o.checkpoint.init_from.empty())
    throw Error(o.where(), "--init-from with --resume", "resume restores the weights: give one of them");
  if (o.checkpoint.resume == "latest" && o.checkpoint.save_dir.empty())
    throw Error(o.where(), "--resume latest without --save-dir",
                "give --save-dir, or the checkpoint's path to --resume");
  if ((o.checkpoint.save_every > 0 || o.checkpoint.keep > 0 || o.checkpoint.async_save) &&
      o.checkpoint.save_dir.empty())
    throw Error(o.where(), "--save-every, --keep or --async-save without --save-dir", "give --save-dir");
}

// A file the run will write, created now (the run truncates it, or appends when resuming).
inline void probe_writable(const Options& o, const std::string& option, const std::string& path) {
  if (path.empty()) return;
  std::ofstream probe(path, std::ios::app);
  if (!probe) throw Error(o.where(option), cat("cannot write '", path, "'"), "give a path in a writable directory");
}

// Where the run writes, checked by the printing process now, not after the GEMM measurement: the
// log, the trace and the save directory, whose lock it returns (one trainer per save directory;
// taking it also proves the directory writable). Other processes return none.
inline std::optional<checkpoint::DirectoryLock> claim_outputs(const Options& o, const Launch& launch) {
  if (!launch.lead()) return std::nullopt;
  probe_writable(o, "--log", o.logging.log);
  probe_writable(o, "--trace", o.logging.trace);
  if (o.checkpoint.save_dir.empty()) return std::nullopt;
  std::error_code ec;
  std::filesystem::create_directories(o.checkpoint.save_dir, ec);
  if (ec || !std::filesystem::is_directory(o.checkpoint.save_dir))
    throw Error(o.where("--save-dir"),
                cat("cannot create the directory '", o.checkpoint.save_dir, "'", ec ? cat(": ", ec.message()) : ""),
                "give a directory that can be created and written");
  return std::optional<checkpoint::DirectoryLock>(std::in_place, o.checkpoint.save_dir);
}

// --resume resolved once for the process (every thread rank loads this step directory, so a `latest`
// that moves meanwhile, another trainer saving or pruning, cannot split them) and checked against
// --steps and the run's model family (`family`; a checkpoint from before weft recorded it is left to
// the load's checks of its tensors). Checkpoints past the resumed step (a run this one rolls back) are kept, and said:
// --keep prunes only the steps up to the ones this run saves (checkpoint/save.hpp).
inline void resolve_resume(Options& o, const Launch& launch, const std::string& family) {
  if (o.checkpoint.resume.empty()) return;
  o.checkpoint.resume =
      checkpoint::resolve(o.checkpoint.resume == "latest" ? o.checkpoint.save_dir : o.checkpoint.resume);
  const checkpoint::Manifest m = checkpoint::peek(o.checkpoint.resume);  // exit 1 when not a valid checkpoint
  if (!m.family.empty() && m.family != family)
    throw BadOption(Error(o.where("--resume"),
                          cat("the checkpoint ", o.checkpoint.resume, " holds a model of the family '", m.family,
                              "'; this run trains '", family, "'"),
                          cat("give --model ", m.family, ", or resume a checkpoint of ", family)));
  if (m.step >= o.optim.steps)
    throw BadOption(Error(
        o.where("--resume"),
        cat("the checkpoint ", o.checkpoint.resume, " is at step ", m.step, ", at or past --steps ", o.optim.steps),
        cat("pass --steps above ", m.step, " to train on from it")));
  if (!launch.lead() || o.checkpoint.save_dir.empty()) return;
  for (const auto& [step, name] : checkpoint::complete_checkpoints(o.checkpoint.save_dir))
    if (step > m.step)
      std::printf("note: %s/%s is past the resumed step %lld; it is kept (--keep prunes steps up to this run's)\n",
                  o.checkpoint.save_dir.c_str(), name.c_str(), static_cast<long long>(m.step));
}

// The checks that read the family's types (F: a family's variant, train::Bound; train/dispatch.hpp
// has already refused what the binary did not compile).

// --context and --attention against the variant and the other options.
template <Family F>
void check_context(const Options& o, const config_t<F>& cfg) {
  if (o.mesh.context == 1) {
    if (o.mesh.attention_given)  // ring too: an attention type is a choice only with --context
      throw Error(o.where(), cat("--attention ", o.mesh.attention, " without --context"),
                  "the attention type shards the sequence over context ranks: give --context >= 2");
    return;
  }
  const std::string where = o.where(cat("--context ", o.mesh.context));
  if (cfg.seq % (2 * static_cast<std::int64_t>(o.mesh.context)) != 0)
    throw Error(where,
                cat("a sequence of ", cfg.seq, " tokens does not split into 2 x ", o.mesh.context, " = ",
                    2 * o.mesh.context, " equal chunks (each context rank holds two)"),
                cat("use --seq a multiple of ", 2 * o.mesh.context, ", or another --context"));
  if (o.data.sample > 0) throw Error(where, "--sample with --context", "sample from a run without --context");
}

// The model's own rules for these sizes on this mesh (heads over tensor ranks, the sequence over SP).
// --expert against the model (one with a mixture of experts) and the mesh (the expert groups are
// carved from the data x context ranks: comm/mesh.hpp).
template <Family F>
void check_expert(const Options& o) {
  if (o.mesh.expert == 1) return;
  const std::string where = o.where(cat("--expert ", o.mesh.expert));
  if constexpr (!nn::contains_layer<typename model_t<F, F32, false, Host>::BlockT, nn::is_router>)
    throw Error(where, cat("the model family '", F::name(), "' has no experts to shard"),
                "leave out --expert, or train a mixture of experts (--model mixtral)");
  const int dc = o.mesh.data * o.mesh.context;
  if (dc % o.mesh.expert != 0)
    throw Error(where,
                cat("the expert groups are carved from the ", dc, " data x context ranks (--data ", o.mesh.data,
                    o.mesh.context > 1 ? cat(" x --context ", o.mesh.context) : std::string(), "), which ",
                    o.mesh.expert, " does not divide"),
                cat("use an expert degree that divides ", dc, ", or more data ranks"));
}

template <Family F>
void check_model(const Options& o, const config_t<F>& cfg) {
  const Spread spread{.data_degree = o.mesh.data,
                      .tensor_degree = o.mesh.tensor,
                      .context_degree = o.mesh.context,
                      .expert_degree = o.mesh.expert};
  if (o.mesh.sequence_parallel()) model_t<F, F32, true, Host>::spec::validate(cfg, spread, o.optim.micro());
  else model_t<F, F32, false, Host>::spec::validate(cfg, spread, o.optim.micro());
}

// --resume of a checkpoint whose model record (every field of the family's config the checkpoint
// keeps: checkpoint/verify.hpp check_model) is not this run's model, refused before anything is
// built (the load would refuse it once the model is, exit 1). A checkpoint that cannot be read, or
// of another family, is left to resolve_resume's messages.
template <Family F>
void check_resume_model(const Options& o, const config_t<F>& cfg) {
  if (o.checkpoint.resume.empty()) return;
  using M = model_t<F, F32, false, Host>;
  if constexpr (requires { M::spec::record(cfg); }) {
    std::optional<checkpoint::Manifest> m;
    try {
      m = checkpoint::peek(
          checkpoint::resolve(o.checkpoint.resume == "latest" ? o.checkpoint.save_dir : o.checkpoint.resume));
    } catch (const Error&) { return; }
    if (!m->family.empty() && m->family != F::name()) return;
    checkpoint::detail::check_model(m->model, M::spec::record(cfg), o.where(cat("--resume ", o.checkpoint.resume)));
  }
}

}  // namespace weft::train
