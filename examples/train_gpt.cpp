// train_gpt: trains a GPT on thread ranks (tensor x data parallel), on the built-in Markov corpus
// (whose entropy rate is the loss floor), an llm.c token file, or a text file.
//
//   train_gpt                                   a tiny GPT, tensor 2 x data 2, on the built-in corpus
//   train_gpt --text book.txt --sample 200      byte-level GPT on a text, then 200 sampled bytes
//   train_gpt --help                            every option
//
// Run-time choices (strategy, dtype) cross into types in one place, dispatch() below; everything
// under it is typed.
#include <weft/weft_host.hpp>

#include <CLI/CLI.hpp>
#include <weft/data/corpus.hpp>
#include <weft/data/loader.hpp>
#include <weft/data/synthetic.hpp>
#include <weft/nn/gpt.hpp>
#include <weft/optim/data_parallel.hpp>
#include <weft/optim/schedule.hpp>
#include <weft/pipeline/executor.hpp>
#include <weft/train/metrics.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <variant>

using namespace weft;

namespace {

struct Options {
  std::string preset = "tiny";
  std::optional<std::int64_t> layers, heads, width, seq, vocab;
  int data = 2, tensor = 2;
  std::string strategy = "ddp";
  std::int64_t batch = 16, micro_batch = 0, steps = 600, eval_every = 100, sample = 0;
  std::optional<std::int64_t> warmup;  // default: 5% of the steps
  double lr = 3e-3, min_lr = 3e-4, clip = 1.0;
  std::uint64_t seed = 1;
  std::string data_file, text, dtype = "f32", log;
};

// A source of training sequences and of held-out ones, whatever the corpus.
struct Corpus {
  std::unique_ptr<data::MarkovSource> markov;
  std::unique_ptr<data::TokenFile> file;
  std::unique_ptr<data::WindowCorpus> windows;

  void sequence(std::uint64_t k, std::int32_t* out, std::int64_t n) const {
    if (markov) markov->sequence(k, out, n);
    else windows->sequence(k, out, n);
  }
  void held_out(std::uint64_t k, std::int32_t* out, std::int64_t n) const {
    if (markov) markov->sequence((std::uint64_t{1} << 40) + k, out, n);  // sequences training never reads
    else windows->held_out(static_cast<std::int64_t>(k % static_cast<std::uint64_t>(windows->held_out_sequences(n))), out, n);
  }
  std::optional<double> floor() const { return markov ? std::optional(markov->entropy_rate()) : std::nullopt; }
};

struct HeldOut {
  const Corpus* c;
  void sequence(std::uint64_t k, std::int32_t* out, std::int64_t n) const { c->held_out(k, out, n); }
};

std::string mib(double bytes) { return cat(std::round(bytes / (1 << 20) * 10) / 10, " MiB"); }

// Strategy: optim::Ddp, Zero1, Zero2 or Fsdp over the data axis.
template <class T, bool SP, class Strategy>
int train(const Options& o, const nn::GptConfig& cfg, const Corpus& corpus) {
  const std::int64_t micro = o.micro_batch > 0 ? o.micro_batch : o.batch;
  const std::int64_t accum = o.batch / micro;
  const int ranks = o.data * o.tensor;
  std::printf("measuring the host GEMM rate of %d ranks (the MFU ceiling)...\n", ranks);
  const double peak = train::gemm_rate<T>(ranks);
  const double flops_token = train::flops_per_token(cfg);
  std::printf("train_gpt: %s | %s | data %d x tensor %d | batch %lld (micro %lld x %lld) | %lld steps | GEMM %.1f GFLOP/s\n",
              cat("layers ", cfg.layers, ", heads ", cfg.heads, ", width ", cfg.width, ", seq ", cfg.seq, ", vocab ", cfg.vocab).c_str(),
              (o.strategy + (o.dtype == "f64" ? " f64" : " f32")).c_str(), o.data, o.tensor,
              static_cast<long long>(o.batch), static_cast<long long>(micro), static_cast<long long>(accum),
              static_cast<long long>(o.steps), peak / 1e9);
  if (auto f = corpus.floor()) std::printf("built-in Markov corpus: entropy rate (the loss floor) %.4f nats\n", *f);

  std::ofstream log;
  if (!o.log.empty()) {
    log.open(o.log);
    if (!log) throw Error("train_gpt", cat("cannot write the log file ", o.log), "check the path");
  }
  std::mutex mu;
  double final_loss = 0, final_eval = NAN, total_time = 0;
  std::vector<std::int32_t> sample_out;
  const auto schedule = optim::Schedule::warmup_cosine(o.lr, o.warmup.value_or(o.steps / 20), o.steps, o.min_lr);
  std::vector<std::int64_t> peaks(static_cast<std::size_t>(ranks));

  run_threads(ranks, [&](ThreadComm& world) {
    Mesh mesh{world, {.data = o.data, .tensor = o.tensor}};
    Host host;
    using Model = nn::Gpt<T, SP>;
    Model gpt(host, cfg, mesh.spread(), micro);
    auto dp = optim::data_parallel<Strategy>(gpt, optim::AdamW{.config = {.lr = o.lr}}, mesh);
    // One micro-batch forward and backward; last: the last one before the step (DDP reduces then).
    auto micro_batch = [&](const std::vector<std::int32_t>& xs, const std::vector<std::int32_t>& ys, double scale,
                           bool last) {
      auto ctx = gpt.context({xs, ys, micro, scale});
      return pipeline::forward_backward(gpt, ctx, mesh, dp, last);
    };
    // The forward alone, keeping nothing for backward (evaluation, sampling).
    auto infer = [&](const std::vector<std::int32_t>& xs, const std::vector<std::int32_t>& ys) {
      auto ctx = gpt.context({xs, ys, micro});
      pipeline::forward(gpt, ctx, mesh, dp, nn::Mode::infer);
      return ctx;
    };
    data::Loader<Corpus> loader(corpus, cfg.seq, micro, o.data, mesh.coord().data);
    const HeldOut held{&corpus};
    std::vector<std::int32_t> x, y;
    const bool lead = world.rank() == 0;

    auto evaluate = [&] {
      data::Loader<HeldOut> eval(held, cfg.seq, micro, o.data, mesh.coord().data);
      double sum = 0;
      const int batches = 16;  // 16 micro-batches: the standard error of the mean is ~0.01 nats on the tiny preset
      for (int i = 0; i < batches; ++i) {
        eval.next(x, y);
        sum += infer(x, y).loss;
      }
      return sum / batches;
    };

    const auto start = std::chrono::steady_clock::now();
    for (std::int64_t step = 0; step < o.steps; ++step) {
      const auto t0 = std::chrono::steady_clock::now();
      dp.zero_grad();
      double loss = 0;
      for (std::int64_t a = 0; a < accum; ++a) {
        loader.next(x, y);
        loss += micro_batch(x, y, 1.0 / static_cast<double>(accum), a + 1 == accum) / static_cast<double>(accum);
      }
      const double lr = schedule.lr(step);
      const double norm = dp.step(lr, o.clip);
      const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      std::vector<std::int64_t> peak_bytes{host.memory().total_peak};
      world.all_reduce(std::span<std::int64_t>(peak_bytes), ReduceOp::max);
      const bool eval_now = o.eval_every > 0 && ((step + 1) % o.eval_every == 0 || step + 1 == o.steps);
      const double eval_loss = eval_now ? evaluate() : NAN;
      if (!lead) continue;
      const double tokens_s = static_cast<double>(o.batch * cfg.seq) / dt;
      const double mfu = tokens_s * flops_token / peak;
      std::string floor_note;
      if (auto f = corpus.floor()) {
        char buf[32];
        std::snprintf(buf, sizeof buf, " (floor %+.3f)", loss - *f);
        floor_note = buf;
      }
      std::printf("step %5lld/%lld | loss %.4f%s | lr %.2e | norm %.3f | %8.0f tok/s | MFU %5.1f%% | peak %s/rank%s\n",
                  static_cast<long long>(step + 1), static_cast<long long>(o.steps), loss, floor_note.c_str(), lr, norm,
                  tokens_s, 100 * mfu, mib(static_cast<double>(peak_bytes[0])).c_str(),
                  eval_now ? cat(" | eval ", std::round(eval_loss * 10000) / 10000).c_str() : "");
      std::fflush(stdout);
      if (log.is_open()) {
        log << nlohmann::json{{"step", step + 1}, {"loss", loss}, {"lr", lr}, {"grad_norm", norm}, {"tokens_per_s", tokens_s},
                              {"mfu", mfu}, {"peak_bytes", peak_bytes[0]}}.dump()
            << "\n";
        if (eval_now) log << nlohmann::json{{"step", step + 1}, {"eval_loss", eval_loss}}.dump() << "\n";
      }
      final_loss = loss;
      if (eval_now) final_eval = eval_loss;
    }
    if (lead) total_time = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

    // Sampling: the last position's logits, gathered over the tensor axis, sampled with Philox.
    if (o.sample > 0) {
      std::vector<std::int32_t> window(static_cast<std::size_t>(cfg.seq));
      corpus.held_out(0, window.data(), cfg.seq);
      std::vector<std::int32_t> tokens(static_cast<std::size_t>(micro / o.data * cfg.seq)), targets(tokens.size(), 0);
      const std::int64_t Vl = nn::padded_vocab(cfg.vocab, o.tensor) / o.tensor;
      for (std::int64_t i = 0; i < o.sample; ++i) {
        for (std::int64_t b = 0; b < micro / o.data; ++b) std::copy(window.begin(), window.end(), tokens.begin() + b * cfg.seq);
        const auto ctx = infer(tokens, targets);
        const auto& logits = ctx.head.ce.logits;  // (B/dp, T, Vp/tp) Shard<-1>
        std::vector<T> all(static_cast<std::size_t>(Vl * o.tensor));
        mesh.tensor().all_gather(std::span<const T>(logits.data() + logits.numel() - Vl, static_cast<std::size_t>(Vl)),
                                 std::span<T>(all));
        double mx = -1e300, z = 0;
        for (std::int64_t v = 0; v < cfg.vocab; ++v) mx = std::max(mx, static_cast<double>(all[static_cast<std::size_t>(v)]));
        for (std::int64_t v = 0; v < cfg.vocab; ++v) z += std::exp(static_cast<double>(all[static_cast<std::size_t>(v)]) - mx);
        double u = weft::uniform(o.seed, 99, static_cast<std::uint64_t>(i)) * z, c = 0;
        std::int32_t next = static_cast<std::int32_t>(cfg.vocab - 1);
        for (std::int64_t v = 0; v < cfg.vocab; ++v)
          if ((c += std::exp(static_cast<double>(all[static_cast<std::size_t>(v)]) - mx)) >= u) {
            next = static_cast<std::int32_t>(v);
            break;
          }
        window.erase(window.begin());
        window.push_back(next);
        if (lead) sample_out.push_back(next);
      }
    }
    peaks[static_cast<std::size_t>(world.rank())] = host.memory().total_peak;
  });

  std::printf("done: %lld steps in %.1f s, final loss %.4f", static_cast<long long>(o.steps), total_time, final_loss);
  if (!std::isnan(final_eval)) std::printf(", held-out loss %.4f", final_eval);
  if (auto f = corpus.floor()) std::printf(" (floor %.4f; %+.4f nats from it)", *f, (std::isnan(final_eval) ? final_loss : final_eval) - *f);
  std::printf(", peak memory %s per rank\n", mib(static_cast<double>(*std::max_element(peaks.begin(), peaks.end()))).c_str());
  if (!sample_out.empty())
    std::printf("sample:\n%s\n", data::ByteTokenizer::decode(std::span<const std::int32_t>(sample_out)).c_str());
  return 0;
}

// The compiled strategies, by name. The one closed dispatch from run-time choices to instantiations.
const std::vector<std::string> kStrategies{"ddp", "ddp-sp", "zero1", "zero1-sp", "zero2", "zero2-sp", "fsdp", "fsdp-sp"};

void check_strategy(const std::string& name) {
  if (std::find(kStrategies.begin(), kStrategies.end(), name) == kStrategies.end())
    throw Error("train_gpt", cat("strategy '", name, "' is not available"),
                cat("use one of: ", join(kStrategies)));
}

int dispatch(const Options& o, const nn::GptConfig& cfg, const Corpus& corpus) {
  check_strategy(o.strategy);
  const bool sp = o.strategy.ends_with("-sp");
  auto with = [&]<class T>() {
    auto strategy = [&]<class S>() { return sp ? train<T, true, S>(o, cfg, corpus) : train<T, false, S>(o, cfg, corpus); };
    if (o.strategy.starts_with("zero1")) return strategy.template operator()<optim::Zero1>();
    if (o.strategy.starts_with("zero2")) return strategy.template operator()<optim::Zero2>();
    if (o.strategy.starts_with("fsdp")) return strategy.template operator()<optim::Fsdp>();
    return strategy.template operator()<optim::Ddp>();
  };
  if (o.dtype == "f32") return with.template operator()<float>();
  if (o.dtype == "f64") return with.template operator()<double>();
  throw Error("train_gpt", cat("dtype '", o.dtype, "' is not available on the host"), "use f32 or f64");
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"weft train_gpt: a tensor- and data-parallel GPT on thread ranks"};
  app.add_option("--preset", o.preset, "model size: tiny, small, gpt2-124m")->check(CLI::IsMember({"tiny", "small", "gpt2-124m"}));
  app.add_option("--layers", o.layers, "override the preset's layers");
  app.add_option("--heads", o.heads, "override the preset's heads");
  app.add_option("--width", o.width, "override the preset's width");
  app.add_option("--seq", o.seq, "override the preset's sequence length");
  app.add_option("--vocab", o.vocab, "override the preset's vocabulary");
  app.add_option("--data", o.data, "data-parallel degree")->check(CLI::PositiveNumber);
  app.add_option("--tensor", o.tensor, "tensor-parallel degree")->check(CLI::PositiveNumber);
  app.add_option("--strategy", o.strategy, "ddp, zero1, zero2 or fsdp, each also with -sp (sequence parallelism)");
  app.add_option("--batch", o.batch, "global batch, in sequences")->check(CLI::PositiveNumber);
  app.add_option("--micro-batch", o.micro_batch, "global micro-batch (gradient accumulation); default: the batch");
  app.add_option("--steps", o.steps, "optimizer steps")->check(CLI::PositiveNumber);
  app.add_option("--lr", o.lr, "peak learning rate")->check(CLI::PositiveNumber);
  app.add_option("--warmup", o.warmup, "linear warm-up steps (default: 5% of the steps)")->check(CLI::NonNegativeNumber);
  app.add_option("--min-lr", o.min_lr, "learning rate at the end of the cosine")->check(CLI::NonNegativeNumber);
  app.add_option("--clip", o.clip, "global gradient-norm clip (0: off)")->check(CLI::NonNegativeNumber);
  app.add_option("--seed", o.seed, "seed of the weights and the built-in corpus");
  auto* file_opt = app.add_option("--data-file", o.data_file, "llm.c token file (.bin)");
  app.add_option("--text", o.text, "plain-text file, byte-level tokens")->excludes(file_opt);
  app.add_option("--eval-every", o.eval_every, "held-out loss every N steps (0: never)")->check(CLI::NonNegativeNumber);
  app.add_option("--dtype", o.dtype, "f32 or f64")->check(CLI::IsMember({"f32", "f64"}));
  app.add_option("--log", o.log, "JSON lines, one per step");
  app.add_option("--sample", o.sample, "after training on --text, print N sampled bytes")->check(CLI::NonNegativeNumber);
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    app.exit(e);
    return 2;
  }

  nn::GptConfig cfg;
  if (o.preset == "tiny") cfg = {.vocab = 64, .seq = 64, .layers = 2, .heads = 4, .width = 64};
  if (o.preset == "small") cfg = {.vocab = 256, .seq = 128, .layers = 4, .heads = 4, .width = 128};
  if (o.preset == "gpt2-124m") cfg = {.vocab = 50257, .seq = 1024, .layers = 12, .heads = 12, .width = 768};
  if (!o.text.empty() && !o.vocab) cfg.vocab = data::ByteTokenizer::vocab;
  if (o.layers) cfg.layers = *o.layers;
  if (o.heads) cfg.heads = *o.heads;
  if (o.width) cfg.width = *o.width;
  if (o.seq) cfg.seq = *o.seq;
  if (o.vocab) cfg.vocab = *o.vocab;
  cfg.seed = o.seed;

  // Bad options: checked before anything is built, exit code 2.
  try {
    check_strategy(o.strategy);
    const std::int64_t micro = o.micro_batch > 0 ? o.micro_batch : o.batch;
    if (o.batch % micro != 0)
      throw Error("train_gpt", cat("batch ", o.batch, " is not a multiple of the micro-batch ", micro),
                  "use a micro-batch that divides the batch");
    nn::validate(cfg, {.data_degree = o.data, .tensor_degree = o.tensor}, o.strategy.ends_with("-sp"), micro);
    (void)optim::Schedule::warmup_cosine(o.lr, o.warmup.value_or(o.steps / 20), o.steps, o.min_lr);
    validate(MeshShape{.data = o.data, .tensor = o.tensor}, o.data * o.tensor);
    if (!o.text.empty() && cfg.vocab < 256)
      throw Error("train_gpt", cat("vocabulary ", cfg.vocab, " with --text"), "byte-level text needs a vocabulary of 256");
    if (o.sample > 0 && o.text.empty())
      throw Error("train_gpt", "--sample without --text", "sampling prints text: train on --text");
  } catch (const Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
  }

  try {
    Corpus corpus;
    if (!o.data_file.empty()) {
      corpus.file = std::make_unique<data::TokenFile>(o.data_file, cfg.vocab);
      corpus.windows = std::make_unique<data::WindowCorpus>(*corpus.file, o.seed);
      corpus.windows->require_windows(cfg.seq + 1);
    } else if (!o.text.empty()) {
      corpus.windows = std::make_unique<data::WindowCorpus>(data::WindowCorpus::from_text_file(o.text, o.seed));
      corpus.windows->require_windows(cfg.seq + 1);
    } else {
      corpus.markov = std::make_unique<data::MarkovSource>(cfg.vocab, o.seed);
    }
    return dispatch(o, cfg, corpus);
  } catch (const Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}
