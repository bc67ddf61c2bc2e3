// weft-plan: the plan of a GPT on any number of GPUs, from a small cluster description, for every
// strategy this binary was compiled with (DDP, ZeRO-1, ZeRO-2, FSDP, each with and without sequence
// parallelism, without or with full recompute), every tensor degree that fits in a node, and
// pipelines (1F1B, ZB-H1 and interleaved 1F1B with 2 virtual stages over every pipe degree that
// divides the layers and the GPUs); ranked by step time among those that fit in memory. Nothing is allocated and no GPU is needed.
//
//   weft-plan --preset gpt2-124m --gpus 1024 --batch 512 --micro 4
//   weft-plan --cluster cluster.json --layers 48 --width 6144 --heads 48 --seq 2048 --gpus 4096 --batch 2048
//
// Per candidate: the peak bytes of a step on one rank (weft/plan/step.hpp: the host allocator's
// counts, plus the CUDA back end's workspace estimate), the step time (weft/plan/time.hpp) with
// rates derived from the cluster: GEMMs and the attention core at a fraction of the peak FLOP/s,
// elementwise ops at the HBM bandwidth, tensor-parallel collectives on the intra-node link, data
// collectives on the inter-node link once the data group leaves the node. No overlap (weft's
// executors run collectives and compute in turn). A pipeline's memory is the largest pipe rank's
// replay of the schedule's table (footprint::pipeline_step), its time estimate::pipeline_seconds
// with messages on the intra-node link while a pipe group fits in a node (ranks tensor-innermost,
// then pipe), else the inter-node one; its parts are the pipe-1 parts over the pipe degree, plus
// `pipeline`: the schedule's idle time, its messages and the ranks' imbalance.
#include <weft/weft_host.hpp>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>
#include <weft/core/files.hpp>
#include <weft/core/json_limits.hpp>
#include <weft/plan/step.hpp>
#include <weft/plan/time.hpp>
#include <weft/train/metrics.hpp>

#include "cli.hpp"

using namespace weft;

namespace {

struct Cluster {
  int gpus = 8, gpus_per_node = 8;
  double memory_gib = 141;             // device memory (H200)
  double peak_tflops = 989;            // dense bf16 (H200 SXM)
  double hbm_gbps = 4800;              // device memory bandwidth, GB/s
  double intra_gbps = 450, intra_us = 3;   // NVLink per GPU, one direction; latency per message
  double inter_gbps = 50, inter_us = 10;   // InfiniBand NDR 400 Gb/s per GPU; latency per message
  double gemm_efficiency = 0.7;        // of the peak, for the step's GEMMs
  double attention_efficiency = 0.3;   // of the peak, for the attention core (materialized scores)
};

struct Candidate {
  std::string strategy;
  int tensor = 1, data = 1, pipe = 1;
  std::string schedule = "-";
  double pipeline_s = 0;  // a pipeline's step beyond its parts (idle time, messages, imbalance)
  std::int64_t micro = 0, accumulation = 0;
  std::int64_t peak_bytes = 0, state_bytes = 0, workspace_bytes = 0;
  estimate::Breakdown time;
  bool fits = false;
};

template <class T>
estimate::Rates cluster_rates(const Cluster& k, int tensor, int data, int pipe = 1) {
  const double peak = k.peak_tflops * 1e12, hbm = k.hbm_gbps * 1e9, e = sizeof(T);
  estimate::Rates r;
  r.gemm_flops = [f = peak * k.gemm_efficiency](const estimate::Gemm&) { return f; };
  r.attention_flops = peak * k.attention_efficiency;
  // Bytes each op moves per element, forward and backward: GELU and LayerNorm read and write their
  // input, output and saved copy (7 e), the cross-entropy reads the logits three times and writes
  // their gradient (4 e), AdamW reads and writes f32 state (30 bytes with the master's rounding).
  r.elements = {.gelu = hbm / (7 * e), .layernorm = hbm / (7 * e), .cross_entropy = hbm / (4 * e), .adamw = hbm / 30};
  r.bandwidth = hbm;
  r.first_touch = hbm;  // a caching allocator: fresh blocks cost a write, like any other
  const estimate::Link intra{k.intra_us * 1e-6, 1 / (k.intra_gbps * 1e9)}, inter{k.inter_us * 1e-6, 1 / (k.inter_gbps * 1e9)};
  r.tensor = intra;  // tensor groups stay inside a node (the ranks are laid out tensor-innermost)
  r.data = tensor * pipe * data > k.gpus_per_node ? inter : intra;
  return r;
}

// The candidates, and why the layouts left out were (one line per reason).
struct Candidates {
  std::vector<Candidate> list;
  std::vector<std::string> skipped;

  void skip(std::string why) {
    if (std::find(skipped.begin(), skipped.end(), why) == skipped.end()) skipped.push_back(std::move(why));
  }
};

template <class Strategy, class P, bool SP, class R>
void consider(Candidates& out, const char* name, const gpt2::Config& c, const Cluster& k, std::int64_t batch,
              std::int64_t micro_per_gpu, int tensor, int pipe = 1, pipeline::Kind kind = pipeline::Kind::one_f_one_b,
              int virtual_stages = 1) {
  using T = typename precision_t<P>::compute;
  const int data = k.gpus / tensor / pipe;
  const Spread s{.data_degree = data, .tensor_degree = tensor};
  const std::int64_t micro = micro_per_gpu * data;
  const std::string layout = cat("tensor ", tensor, SP ? " with SP" : "", pipe > 1 ? cat(", pipe ", pipe) : "", ", data ", data);
  if (batch % micro != 0)
    return out.skip(cat(layout, ": the batch of ", batch, " is not a multiple of the micro-batch ", micro, " (", micro_per_gpu,
                        " per GPU)"));
  try {
    gpt2::validate(c, s, SP, micro);
  } catch (const Error& e) {
    return out.skip(cat(layout, ": ", e.what()));  // sizes this degree does not divide
  }
  const estimate::Work w = estimate::work<Strategy, P, SP, R>(c, s, micro, batch / micro);
  Candidate x;
  x.strategy = name;
  x.tensor = tensor;
  x.data = data;
  x.pipe = pipe;
  x.micro = micro;
  x.accumulation = batch / micro;
  x.workspace_bytes = footprint::cuda_workspace(c, s, micro);
  const estimate::Rates rates = cluster_rates<T>(k, tensor, data, pipe);
  x.time = estimate::seconds(w, rates);
  if (pipe == 1) {
    x.peak_bytes = w.memory.total + x.workspace_bytes;
    x.state_bytes = w.memory.after.total();
  } else {
    const pipeline::Table table = pipeline::make_table(kind, pipe, static_cast<int>(x.accumulation), virtual_stages);
    x.schedule = kind == pipeline::Kind::zero_bubble_h1 ? "zb"
                 : kind == pipeline::Kind::interleaved  ? cat("int", virtual_stages)
                                                        : "1f1b";
    for (int r = 0; r < pipe; ++r) {  // the largest pipe rank
      const auto st = footprint::pipeline_step<Strategy, P, SP, R>(c, s, micro, table, r);
      x.peak_bytes = std::max(x.peak_bytes, st.total + x.workspace_bytes);
      x.state_bytes = std::max(x.state_bytes, st.after.total());
    }
    const estimate::Link intra{k.intra_us * 1e-6, 1 / (k.intra_gbps * 1e9)}, inter{k.inter_us * 1e-6, 1 / (k.inter_gbps * 1e9)};
    const estimate::PipelineTime pt =
        estimate::pipeline_seconds<Strategy, P, SP, R>(c, s, micro, table, rates, tensor * pipe > k.gpus_per_node ? inter : intra);
    // The pipe-1 parts shared over the pipe ranks; the rest is the pipeline's own.
    for (double* part : {&x.time.gemm, &x.time.attention, &x.time.elementwise, &x.time.memory, &x.time.tensor_comm,
                         &x.time.data_comm})
      *part /= pipe;
    x.pipeline_s = pt.step - x.time.total();
  }
  x.fits = static_cast<double>(x.peak_bytes) <= k.memory_gib * (1 << 30);
  out.list.push_back(x);
}

template <class P>
Candidates candidates(const gpt2::Config& c, const Cluster& k, std::int64_t batch, std::int64_t micro) {
  Candidates out;
  for (int tp = 1; tp <= k.gpus_per_node && tp <= k.gpus; tp *= 2) {
    if (k.gpus % tp != 0) {
      out.skip(cat("tensor ", tp, ": does not divide ", k.gpus, " GPUs"));
      continue;
    }
    auto both = [&]<class R>(const char* suffix) {
      const std::string n(suffix);
      consider<optim::Ddp, P, false, R>(out, ("ddp" + n).c_str(), c, k, batch, micro, tp);
      consider<optim::Ddp, P, true, R>(out, ("ddp-sp" + n).c_str(), c, k, batch, micro, tp);
      consider<optim::Zero1, P, false, R>(out, ("zero1" + n).c_str(), c, k, batch, micro, tp);
      consider<optim::Zero1, P, true, R>(out, ("zero1-sp" + n).c_str(), c, k, batch, micro, tp);
      consider<optim::Zero2, P, false, R>(out, ("zero2" + n).c_str(), c, k, batch, micro, tp);
      consider<optim::Zero2, P, true, R>(out, ("zero2-sp" + n).c_str(), c, k, batch, micro, tp);
      consider<optim::Fsdp, P, false, R>(out, ("fsdp" + n).c_str(), c, k, batch, micro, tp);
      consider<optim::Fsdp, P, true, R>(out, ("fsdp-sp" + n).c_str(), c, k, batch, micro, tp);
    };
    both.template operator()<recompute::None>("");
    both.template operator()<recompute::Full>(" +recompute");
    // Pipelines: every pipe degree (a power of two) that divides the layers and the GPUs left by
    // the tensor degree, and whose micro-batch count is at least the pipe degree.
    for (int pp = 2; pp <= c.layers && tp * pp <= k.gpus; pp *= 2) {
      if (c.layers % pp != 0 || k.gpus % (tp * pp) != 0) continue;
      const std::int64_t per_micro = micro * (k.gpus / tp / pp);
      if (batch % per_micro != 0 || batch / per_micro < pp) {
        out.skip(cat("tensor ", tp, ", pipe ", pp, ": fewer micro-batches than pipe ranks, or a batch of ", batch,
                     " that is not a multiple of ", per_micro));
        continue;
      }
      auto piped = [&]<class R>(const char* suffix, pipeline::Kind kind, int v) {
        const std::string n(suffix);
        consider<optim::Ddp, P, false, R>(out, ("ddp" + n).c_str(), c, k, batch, micro, tp, pp, kind, v);
        consider<optim::Zero1, P, false, R>(out, ("zero1" + n).c_str(), c, k, batch, micro, tp, pp, kind, v);
        consider<optim::Zero1, P, true, R>(out, ("zero1-sp" + n).c_str(), c, k, batch, micro, tp, pp, kind, v);
        consider<optim::Fsdp, P, false, R>(out, ("fsdp" + n).c_str(), c, k, batch, micro, tp, pp, kind, v);
      };
      piped.template operator()<recompute::None>("", pipeline::Kind::one_f_one_b, 1);
      piped.template operator()<recompute::None>("", pipeline::Kind::zero_bubble_h1, 1);
      piped.template operator()<recompute::Full>(" +recompute", pipeline::Kind::one_f_one_b, 1);
      // Interleaved: two virtual stages per rank, where the layers split into 2 pp stages and the
      // micro-batches come in whole groups of pp.
      if (c.layers % (2 * pp) == 0 && batch / per_micro % pp == 0)
        piped.template operator()<recompute::None>("", pipeline::Kind::interleaved, 2);
    }
  }
  std::stable_sort(out.list.begin(), out.list.end(), [](const Candidate& a, const Candidate& b) {
    if (a.fits != b.fits) return a.fits;
    return a.time.total() + a.pipeline_s < b.time.total() + b.pipeline_s;
  });
  return out;
}

void read_cluster(const std::string& path, Cluster& k) {
  // A regular file (a FIFO would block the read) of at most 1 MiB, nested at most 4 deep (values are
  // numbers: JSON's printing of a deep value, in an error message, would overflow the stack).
  const std::string text = read_text_file(path, 1 << 20, "weft-plan --cluster");
  check_json_limits(text, {.max_bytes = 1 << 20, .max_depth = 4}, cat("weft-plan --cluster '", path, "'"));
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw Error("weft-plan --cluster", cat("'", path, "' is not JSON: ", e.what()), "write an object of the documented keys");
  }
  if (!j.is_object()) throw Error("weft-plan --cluster", cat("'", path, "' is not a JSON object"), "write {\"gpus_per_node\": 8, ...}");
  auto number = [&](const char* key, double& v, double lo) {
    if (!j.contains(key)) return;
    if (!j[key].is_number() || !std::isfinite(j[key].get<double>()) || j[key].get<double>() < lo)
      throw Error("weft-plan --cluster", cat("'", path, "': ", key, " is ", j[key].dump()), cat("give a number >= ", lo));
    v = j[key].get<double>();
  };
  if (j.contains("gpus_per_node")) {
    const auto& g = j["gpus_per_node"];
    if (!g.is_number_integer() || g.get<std::int64_t>() < 1 || g.get<std::int64_t>() > 1024)
      throw Error("weft-plan --cluster", cat("'", path, "': gpus_per_node is ", g.dump()), "give a whole number from 1 to 1024");
    k.gpus_per_node = g.get<int>();
  }
  number("memory_gib", k.memory_gib, 0);
  number("peak_tflops", k.peak_tflops, 1e-6);
  number("hbm_gbps", k.hbm_gbps, 1e-6);
  number("intra_gbps", k.intra_gbps, 1e-6);
  number("intra_us", k.intra_us, 0);
  number("inter_gbps", k.inter_gbps, 1e-6);
  number("inter_us", k.inter_us, 0);
  number("gemm_efficiency", k.gemm_efficiency, 1e-6);
  number("attention_efficiency", k.attention_efficiency, 1e-6);
  for (const auto& [key, v] : j.items()) {
    static const std::vector<std::string> known{"gpus_per_node", "memory_gib", "peak_tflops", "hbm_gbps",
                                                "intra_gbps", "intra_us", "inter_gbps", "inter_us",
                                                "gemm_efficiency", "attention_efficiency"};
    if (std::find(known.begin(), known.end(), key) == known.end())
      throw Error("weft-plan --cluster", cat("'", path, "': unknown key '", key, "'"),
                  "use gpus_per_node, memory_gib, peak_tflops, hbm_gbps, intra_gbps, intra_us, inter_gbps, inter_us, "
                  "gemm_efficiency, attention_efficiency");
  }
}

std::string gib(double b) { return cat(std::round(b / (1 << 30) * 100) / 100); }

}  // namespace

int main(int argc, char** argv) {
  using examples::above;
  using examples::at_least;
  using examples::at_most;
  CLI::App app{"weft-plan: memory and step time of a GPT on a cluster, for every compiled strategy"};
  std::string preset = "gpt2-124m", cluster_file, dtype = "bf16";
  std::optional<std::int64_t> layers, heads, width, seq, vocab;
  std::int64_t batch = 512, micro = 1;
  int show = 12;
  bool json = false;
  Cluster k;
  app.add_option("--preset", preset, "model: tiny, small, gpt2-124m, gpt2-1.5b")->check(CLI::IsMember(gpt2::preset_names()));
  app.add_option("--layers", layers, "override the preset's layers")->check(at_least(1));
  app.add_option("--heads", heads, "override the preset's heads")->check(at_least(1));
  app.add_option("--width", width, "override the preset's width")->check(at_least(1));
  app.add_option("--seq", seq, "override the preset's sequence length")->check(at_least(1));
  app.add_option("--vocab", vocab, "override the preset's vocabulary")->check(at_least(1));
  app.add_option("--dtype", dtype, "bf16 (mixed, f32 master) or f32")->check(CLI::IsMember({"bf16", "f32"}));
  app.add_option("--gpus", k.gpus, "GPUs in all")->check(at_least(1))->check(at_most(1 << 20));
  app.add_option("--batch", batch, "global batch, in sequences")->check(at_least(1));
  app.add_option("--micro", micro, "sequences per GPU per micro-batch")->check(at_least(1));
  app.add_option("--cluster", cluster_file, "JSON: gpus_per_node, memory_gib, peak_tflops, hbm_gbps, intra_gbps, intra_us, "
                                            "inter_gbps, inter_us, gemm_efficiency, attention_efficiency (defaults: 8 x H200 "
                                            "nodes, NVLink, 400 Gb/s InfiniBand per GPU)");
  app.add_option("--gpus-per-node", k.gpus_per_node, "overrides the cluster's")->check(at_least(1))->check(at_most(1024));
  app.add_option("--memory-gib", k.memory_gib, "device memory, overrides the cluster's")->check(above(0));
  app.add_option("--peak-tflops", k.peak_tflops, "dense peak, overrides the cluster's")->check(above(0));
  app.add_option("--show", show, "candidates to print")->check(at_least(1));
  app.add_flag("--json", json, "one JSON object per candidate instead of the table");
  if (const auto rc = examples::parse(app, argc, argv)) return *rc;
  try {
    if (!cluster_file.empty()) {
      const Cluster given = k;
      read_cluster(cluster_file, k);
      // Options given on the command line win over the file.
      if (app.count("--gpus-per-node")) k.gpus_per_node = given.gpus_per_node;
      if (app.count("--memory-gib")) k.memory_gib = given.memory_gib;
      if (app.count("--peak-tflops")) k.peak_tflops = given.peak_tflops;
    }
    gpt2::Config c = gpt2::preset(preset);
    c.layers = layers.value_or(c.layers);
    c.heads = heads.value_or(c.heads);
    c.width = width.value_or(c.width);
    c.seq = seq.value_or(c.seq);
    c.vocab = vocab.value_or(c.vocab);
    // Sizes whose element counts would overflow the plan's 64-bit counts are refused first.
    const double elements = footprint::approximate_elements(c, static_cast<double>(micro), k.gpus_per_node);
    if (elements > footprint::kMaxElements)
      throw Error("weft-plan", cat("the configuration holds about ", elements, " elements per GPU"),
                  "use a smaller model, sequence or micro-batch");
    if (static_cast<double>(micro) * k.gpus > static_cast<double>(batch))
      throw Error("weft-plan", cat("--micro ", micro, " on ", k.gpus, " GPUs is ", static_cast<double>(micro) * k.gpus,
                                   " sequences per micro-batch, more than the batch of ", batch),
                  "raise --batch or lower --micro or --gpus");
    const Candidates found = dtype == "f32" ? candidates<F32>(c, k, batch, micro) : candidates<Bf16Mixed>(c, k, batch, micro);
    const std::vector<Candidate>& list = found.list;
    const double tokens = static_cast<double>(batch * c.seq), flops = gpt2::flops_per_token(c) * tokens;
    if (!json) {
      std::printf("weft-plan: layers %lld, heads %lld, width %lld, seq %lld, vocab %lld, %s | %d GPUs (%d per node, %.0f GiB, "
                  "%.0f TFLOP/s) | batch %lld, %lld per GPU per micro-batch\n",
                  static_cast<long long>(c.layers), static_cast<long long>(c.heads), static_cast<long long>(c.width),
                  static_cast<long long>(c.seq), static_cast<long long>(c.vocab), dtype.c_str(), k.gpus, k.gpus_per_node,
                  k.memory_gib, k.peak_tflops, static_cast<long long>(batch), static_cast<long long>(micro));
    }
    if (list.empty()) {  // in text or JSON, the reasons on stderr
      std::fprintf(stderr, "weft-plan: no candidate: no layout with a tensor degree up to %d fits the sizes; change --gpus, --micro "
                   "or the model's sizes\n", k.gpus_per_node);
      for (const std::string& why : found.skipped) std::fprintf(stderr, "  %s\n", why.c_str());
      return 2;
    }
    if (!json) {
      std::printf("%-22s %6s %10s %6s %6s %11s %11s %9s %9s %9s %9s %9s %9s %10s %6s\n", "strategy", "tensor", "pipe", "data",
                  "accum", "peak GiB", "state GiB", "step ms", "gemm", "attn", "elemwise", "comm", "pipeline", "tokens/s", "MFU");
    }
    int shown = 0;
    for (const Candidate& x : list) {
      if (shown++ >= show) break;
      const double t = x.time.total() + x.pipeline_s;
      const double mfu = flops / t / (k.gpus * k.peak_tflops * 1e12);
      if (json) {
        const nlohmann::json j{{"strategy", x.strategy}, {"tensor", x.tensor}, {"data", x.data}, {"pipe", x.pipe},
                               {"schedule", x.schedule}, {"pipeline_s", x.pipeline_s}, {"micro_batch", x.micro},
                               {"accumulation", x.accumulation}, {"peak_bytes", x.peak_bytes}, {"state_bytes", x.state_bytes},
                               {"workspace_bytes", x.workspace_bytes}, {"fits", x.fits}, {"step_s", t},
                               {"gemm_s", x.time.gemm}, {"attention_s", x.time.attention}, {"elementwise_s", x.time.elementwise},
                               {"memory_s", x.time.memory}, {"tensor_comm_s", x.time.tensor_comm},
                               {"data_comm_s", x.time.data_comm}, {"tokens_per_s", tokens / t}, {"mfu", mfu}};
        std::printf("%s\n", j.dump().c_str());
      } else {
        const std::string pipe = x.pipe > 1 ? cat(x.pipe, " ", x.schedule) : "1";
        std::printf("%-22s %6d %10s %6d %6lld %11s %11s %9.1f %9.1f %9.1f %9.1f %9.1f %9.1f %10.4g %5.1f%%%s\n", x.strategy.c_str(),
                    x.tensor, pipe.c_str(), x.data, static_cast<long long>(x.accumulation),
                    gib(static_cast<double>(x.peak_bytes)).c_str(), gib(static_cast<double>(x.state_bytes)).c_str(), 1e3 * t,
                    1e3 * x.time.gemm, 1e3 * x.time.attention, 1e3 * (x.time.elementwise + x.time.memory),
                    1e3 * (x.time.tensor_comm + x.time.data_comm), 1e3 * x.pipeline_s, tokens / t, 100 * mfu,
                    x.fits ? "" : "  (does not fit)");
      }
    }
    if (!json)
      std::printf("(ranked by step time among those that fit; peak: the step's peak per GPU, with an estimate of the CUDA "
                  "workspace: cuBLASLt's %.0f MiB and the attention scores; pipe: degree and schedule, the largest pipe rank's "
                  "peak (int2: interleaved, 2 virtual stages); pipeline: the schedule's idle time, messages and imbalance; no "
                  "overlap of communication with "
                  "compute)\n",
                  static_cast<double>(footprint::cuda_workspace(c, {.data_degree = 1, .tensor_degree = 1}, 0)) / (1 << 20));
    if (!json && !found.skipped.empty()) {
      std::printf("left out:\n");
      for (const std::string& why : found.skipped) std::printf("  %s\n", why.c_str());
    }
    return 0;
  } catch (const Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
  }
}
