// A small GPT on 1 and on 4 thread ranks (tensor degree 4), with and without sequence
// parallelism: prints each configuration's plan and shows that the loss and the gradients agree.
//
//   02_tensor_parallel_gpt [--layers N] [--width C] [--heads H] [--seq T] [--vocab V] [--batch B]
#include <weft/weft_host.hpp>
#include <weft/nn/describe.hpp>

#include <CLI/CLI.hpp>
#include <cmath>
#include <cstdio>
#include <map>
#include <mutex>

using namespace weft;

namespace {

struct Result {
  double loss = 0;
  std::map<std::string, std::vector<double>> grads;
};

template <bool SP>
Result train_step(int tp, const nn::GptConfig& c, std::int64_t batch) {
  Result out;
  std::mutex mu;
  std::vector<std::int32_t> tokens(static_cast<std::size_t>(batch * c.seq)), targets(tokens.size());
  for (std::size_t i = 0; i < tokens.size(); ++i) {  // a repeating pattern to predict
    tokens[i] = static_cast<std::int32_t>((i * 7) % static_cast<std::size_t>(c.vocab));
    targets[i] = static_cast<std::int32_t>((i * 7 + 7) % static_cast<std::size_t>(c.vocab));
  }
  run_threads(tp, [&](ThreadComm& world) {
    Mesh mesh{world, {.tensor = tp}};
    Host host;
    nn::Gpt<double, SP, recompute::Selective> gpt(host, c, mesh.spread(), batch);
    auto ctx = gpt.context({tokens, targets, batch});  // one micro-batch in flight
    const double loss = pipeline::forward_backward(gpt, ctx, mesh);  // the stages, forward then backward
    gpt.for_each_param([&](const std::string& name, auto& p) {
      const auto g = redistribute<Replicated>(p.grad, mesh);  // gather the shards (or sum the SP partials) to compare
      if (world.rank() != 0) return;
      std::lock_guard lock(mu);
      out.grads[name].assign(g.data(), g.data() + (name == "wte" ? c.vocab * c.width : g.numel()));
    });
    if (world.rank() == 0) out.loss = loss;
  });
  return out;
}

double worst_gradient_error(const Result& a, const Result& ref) {
  double worst = 0;
  for (const auto& [name, g] : ref.grads) {
    double diff = 0, scale = 0;
    for (std::size_t i = 0; i < g.size(); ++i) {
      diff = std::max(diff, std::fabs(a.grads.at(name)[i] - g[i]));
      scale = std::max(scale, std::fabs(g[i]));
    }
    worst = std::max(worst, diff / scale);
  }
  return worst;
}

}  // namespace

int main(int argc, char** argv) {
  nn::GptConfig c{.vocab = 96, .seq = 32, .layers = 2, .heads = 4, .width = 64};
  std::int64_t batch = 4;
  CLI::App app{"weft: a tensor-parallel GPT on 1 and 4 thread ranks"};
  app.add_option("--layers", c.layers)->check(CLI::PositiveNumber);
  app.add_option("--width", c.width)->check(CLI::PositiveNumber);
  app.add_option("--heads", c.heads)->check(CLI::PositiveNumber);
  app.add_option("--seq", c.seq)->check(CLI::PositiveNumber);
  app.add_option("--vocab", c.vocab)->check(CLI::PositiveNumber);
  app.add_option("--batch", batch)->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);

  try {
    std::printf("%s\n", nn::describe<double, false>(c, batch, {}).c_str());
    std::printf("%s\n", nn::describe<double, true>(c, batch, {.tensor_degree = 4}).c_str());
    const Result one = train_step<false>(1, c, batch);
    const Result tp4 = train_step<false>(4, c, batch);
    const Result sp4 = train_step<true>(4, c, batch);
    std::printf("loss, 1 rank:                   %.15f\n", one.loss);
    std::printf("loss, tensor 4:                 %.15f   gradients within %.1e of 1 rank\n", tp4.loss,
                worst_gradient_error(tp4, one));
    std::printf("loss, tensor 4 + sequence par.: %.15f   gradients within %.1e of 1 rank\n", sp4.loss,
                worst_gradient_error(sp4, one));
    const bool ok = std::fabs(tp4.loss - one.loss) <= 1e-12 * one.loss && std::fabs(sp4.loss - one.loss) <= 1e-12 * one.loss &&
                    worst_gradient_error(tp4, one) <= 1e-12 && worst_gradient_error(sp4, one) <= 1e-12;
    std::printf("%s\n", ok ? "the layouts did not change the numbers" : "MISMATCH");
    return ok ? 0 : 1;
  } catch (const Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
  }
}
