// A small GPT on 1 rank and on 4 ranks (tensor degree 4), with and without sequence parallelism:
// prints each configuration's plan and shows that the loss and the gradients agree. The 4 ranks are
// threads, or under `mpirun -np 4` one process each (example_ranks.hpp); the 1-rank reference runs
// on each rank alone.
//
//   tensor_parallel_gpt [--layers N] [--width C] [--heads H] [--seq T] [--vocab V] [--batch B]
//   mpirun -np 4 tensor_parallel_gpt
#include <weft/nn/describe.hpp>
#include <weft/weft_host.hpp>

#include <cmath>
#include <cstdio>
#include <map>

#include "cli.hpp"
#include "example_ranks.hpp"

using namespace weft;

namespace {

struct Result {
  double loss = 0;
  std::map<std::string, std::vector<double>> grads;
};

// One forward and backward of the GPT on the ranks of `comm` (tensor degree: its size); every rank
// returns the loss and the full (gathered) gradients.
template <bool SP, class Comm>
Result train_step(Comm& comm, const gpt2::Config& c, std::int64_t batch) {
  Result out;
  std::vector<std::int32_t> tokens(static_cast<std::size_t>(batch * c.seq)), targets(tokens.size());
  for (std::size_t i = 0; i < tokens.size(); ++i) {  // a repeating pattern to predict
    tokens[i] = static_cast<std::int32_t>((i * 7) % static_cast<std::size_t>(c.vocab));
    targets[i] = static_cast<std::int32_t>((i * 7 + 7) % static_cast<std::size_t>(c.vocab));
  }
  Mesh mesh{comm, {.tensor = comm.size()}};
  Host host;
  gpt2::Model<double, SP, recompute::Selective> gpt(host, c, mesh.spread(), batch);
  auto ctx = gpt.in_flight({{tokens, targets}, batch});   // one micro-batch in flight
  out.loss = pipeline::forward_backward(gpt, ctx, mesh);  // the stages, forward then backward
  gpt.for_each_param([&](const std::string& name, auto& p) {
    const auto g = redistribute<Replicated>(p.grad, mesh);  // gather the shards (or sum the SP partials) to compare
    out.grads[name].assign(g.data(), g.data() + (name == "wte" ? c.vocab * c.width : g.numel()));
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
  gpt2::Config c{.vocab = 96, .seq = 32, .layers = 2, .heads = 4, .width = 64};
  std::int64_t batch = 4;
  std::string launcher = "auto";
  CLI::App app{"weft: a tensor-parallel GPT on 1 and 4 ranks (threads, or processes under mpirun)"};
  app.add_option("--layers", c.layers)->check(examples::at_least(1));
  app.add_option("--width", c.width)->check(examples::at_least(1));
  app.add_option("--heads", c.heads)->check(examples::at_least(1));
  app.add_option("--seq", c.seq)->check(examples::at_least(1));
  app.add_option("--vocab", c.vocab)->check(examples::at_least(1));
  app.add_option("--batch", batch)->check(examples::at_least(1));
  app.add_option("--launcher", launcher, "threads, mpi or auto (mpi under mpirun)")
      ->check(CLI::IsMember({"threads", "mpi", "auto"}));
  if (const auto stop = examples::parse(app, argc, argv)) return *stop;
  try {  // sizes that the layouts cannot split: refused before any rank starts
    gpt2::validate(c, {}, false, batch);
    gpt2::validate(c, {.tensor_degree = 4}, true, batch);
  } catch (const Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
  }

  return examples::run_ranks(argc, argv, launcher, 4, [&](auto& world) {
    const bool print = world.rank() == 0;
    if (print) {
      std::printf("%s\n", nn::describe<gpt2::Model<double, false, recompute::None, Meta<Host>>>(c, batch, {}).c_str());
      std::printf(
          "%s\n",
          nn::describe<gpt2::Model<double, true, recompute::None, Meta<Host>>>(c, batch, {.tensor_degree = 4}).c_str());
    }
    auto alone = world.split(world.rank(), 0, "alone");  // this rank by itself: the 1-rank reference
    const Result one = train_step<false>(alone, c, batch);
    const Result tp4 = train_step<false>(world, c, batch);
    const Result sp4 = train_step<true>(world, c, batch);
    const double tp_err = worst_gradient_error(tp4, one), sp_err = worst_gradient_error(sp4, one);
    // Tolerance 1e-12: f64, and the layouts only regroup the same sums (a few ulps of reassociation).
    const bool mine = std::fabs(tp4.loss - one.loss) <= 1e-12 * one.loss &&
                      std::fabs(sp4.loss - one.loss) <= 1e-12 * one.loss && tp_err <= 1e-12 && sp_err <= 1e-12;
    std::vector<std::int32_t> bad{mine ? 0 : 1};  // every rank's verdict, so all return the same code
    world.all_reduce(std::span<std::int32_t>(bad));
    if (print) {
      std::printf("loss, 1 rank:                   %.15f\n", one.loss);
      std::printf("loss, tensor 4:                 %.15f   gradients within %.1e of 1 rank\n", tp4.loss, tp_err);
      std::printf("loss, tensor 4 + sequence par.: %.15f   gradients within %.1e of 1 rank\n", sp4.loss, sp_err);
      std::printf("%s\n", bad[0] ? "MISMATCH" : "the layouts did not change the numbers");
    }
    return bad[0] ? 1 : 0;
  });
}
