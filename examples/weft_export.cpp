// weft-export: a weft checkpoint (any mesh, strategy and precision) as a Hugging Face GPT-2
// safetensors file with its config.json, loadable by transformers.GPT2LMHeadModel; optionally the
// logits weft computes from it for given tokens, for tools/reference/hf_compare.py.
//
//   weft-export --checkpoint runs/a --out export/model.safetensors
//   weft-export --checkpoint runs/a --out export/model.safetensors --tokens 1,2,3 --logits export/logits.f32
//
// The logits file is float32, little-endian, (tokens, vocab) row-major: the forward of one sequence
// on one host rank in f32.
#include <weft/weft_host.hpp>

#include <weft/models/gpt2/hf.hpp>
#include <weft/models/gpt2/model.hpp>
#include <weft/optim/data_parallel.hpp>
#include <weft/pipeline/executor.hpp>

#include "cli.hpp"

#include <cstdio>
#include <fstream>
#include <sstream>

using namespace weft;

namespace {

std::vector<std::int32_t> parse_tokens(const std::string& text, std::int64_t vocab, std::int64_t seq) {
  std::vector<std::int32_t> out;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    std::size_t used = 0;
    long long v = -1;
    try {
      v = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != item.size() || v < 0 || v >= vocab)
      throw Error("weft-export --tokens", cat("\"", item.substr(0, 32), "\" is not a token id in [0, ", vocab, ")"),
                  "pass comma-separated ids below the vocabulary");
    out.push_back(static_cast<std::int32_t>(v));
  }
  if (out.empty() || static_cast<std::int64_t>(out.size()) > seq)
    throw Error("weft-export --tokens", cat(out.size(), " tokens for a model of ", seq, " positions"), cat("pass 1 to ", seq, " ids"));
  return out;
}

void write_logits(const std::string& checkpoint, const std::string& path, const std::vector<std::int32_t>& ids) {
  const checkpoint::Reader r(checkpoint);
  gpt2::Config c = gpt2::config_of(r.manifest());
  const std::int64_t n = static_cast<std::int64_t>(ids.size());
  std::vector<float> logits;
  run_threads(1, [&](ThreadComm& world) {
    Host dev;
    Mesh mesh{world, {}};
    gpt2::Model<float> gpt(dev, c, mesh.spread(), 1);
    auto dp = optim::data_parallel<optim::Ddp>(gpt, optim::AdamW{}, mesh);
    checkpoint::load(checkpoint, gpt, dp, mesh, {.optimizer = false});
    // Causal: the first n positions' logits do not depend on what follows; pad with token 0.
    std::vector<std::int32_t> tokens(static_cast<std::size_t>(c.seq), 0), targets(tokens.size(), 0);
    std::copy(ids.begin(), ids.end(), tokens.begin());
    auto ctx = gpt.context({tokens, targets, 1});
    pipeline::forward(gpt, ctx, mesh, dp, nn::Mode::infer);
    const auto all = ctx.head.ce.logits.to_host();  // (1, T, Vp)
    const std::int64_t vp = all.size() / static_cast<std::size_t>(c.seq);
    for (std::int64_t t = 0; t < n; ++t)
      for (std::int64_t v = 0; v < c.vocab; ++v) logits.push_back(all[static_cast<std::size_t>(t * vp + v)]);
  });
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(logits.data()), static_cast<std::streamsize>(logits.size() * sizeof(float)));
  if (!out) throw Error("weft-export", cat("cannot write ", path), "check the path");
  std::printf("logits: %lld x %lld f32 to %s\n", static_cast<long long>(n), static_cast<long long>(c.vocab), path.c_str());
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"weft-export: a weft checkpoint as a Hugging Face GPT-2 safetensors file"};
  std::string checkpoint, out, tokens, logits;
  app.add_option("--checkpoint", checkpoint, "a checkpoint: a step directory, or a directory with latest")->required();
  app.add_option("--out", out, "the safetensors file to write (config.json goes beside it)")->required();
  app.add_option("--tokens", tokens, "comma-separated token ids to compute logits for");
  app.add_option("--logits", logits, "where to write the logits of --tokens (f32, tokens x vocab)");
  if (const auto stop = examples::parse(app, argc, argv)) return *stop;
  try {
    if (logits.empty() != tokens.empty())
      throw Error("weft-export", "--tokens without --logits, or --logits without --tokens", "give both, or neither");
    gpt2::export_hf(checkpoint, out);
    const checkpoint::Reader r(checkpoint);
    const auto c = gpt2::config_of(r.manifest());
    std::printf("exported step %lld of %s (layers %lld, heads %lld, width %lld, seq %lld, vocab %lld) to %s\n",
                static_cast<long long>(r.manifest().step), r.dir().c_str(), static_cast<long long>(c.layers),
                static_cast<long long>(c.heads), static_cast<long long>(c.width), static_cast<long long>(c.seq),
                static_cast<long long>(c.vocab), out.c_str());
    if (!logits.empty()) write_logits(checkpoint, logits, parse_tokens(tokens, c.vocab, c.seq));
  } catch (const Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
  return 0;
}
