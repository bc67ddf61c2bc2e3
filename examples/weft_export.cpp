// weft-export: a weft checkpoint (any mesh, strategy and precision) in Hugging Face's form. A GPT-2
// checkpoint as a safetensors file with its config.json beside it, loadable by
// transformers.GPT2LMHeadModel; a Llama checkpoint (train_gpt --model llama; told apart by its
// record's kv_heads) as a LlamaForCausalLM directory (llama::export_hf: F32 or F64, sharded past
// --max-shard-bytes as save_pretrained shards). Optionally the logits weft computes from it for
// given tokens, for tools/reference/hf_compare.py and the Llama trainer's test.
//
//   weft-export --checkpoint runs/a --out export/model.safetensors
//   weft-export --checkpoint runs/a --out export/model.safetensors --tokens 1,2,3 --logits export/logits.f32
//   weft-export --checkpoint runs/llama --out export/llama [--dtype f64] [--max-shard-bytes 2000000000]
//
// The logits file is float32, little-endian, (tokens, vocab) row-major: the forward of one sequence
// on one host rank in f32.
#include <weft/weft_host.hpp>

#include <weft/models/gpt2/hf.hpp>
#include <weft/models/gpt2/model.hpp>
#include <weft/models/llama/hf.hpp>
#include <weft/models/llama/model.hpp>
#include <weft/optim/data_parallel.hpp>
#include <weft/pipeline/executor.hpp>

#include "cli.hpp"

#include <sys/stat.h>

#include <cstdio>
#include <filesystem>
#include <span>
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

// Writes bytes to `path`, never inside the checkpoint: a regular file (or a new one) through
// path.tmp, fsynced, and a rename, so a full disk leaves no truncated file under the name; anything
// else (a device, a pipe) directly. Every write is checked: a write error is an Error, never exit 0.
void write_out(const std::string& path, const std::string& checkpoint, std::span<const std::byte> bytes) {
  const std::string where = cat("weft-export --logits ", path);
  checkpoint::refuse_inside(std::filesystem::path(path).parent_path().string(), checkpoint, where);
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode)) {
    checkpoint::detail::Fd f(path, O_WRONLY);
    f.write_all(bytes.data(), bytes.size());
    f.close();
    return;
  }
  const std::string tmp = path + ".tmp";
  try {
    checkpoint::write_synced(tmp, std::span<const std::span<const std::byte>>(&bytes, 1));
    if (std::rename(tmp.c_str(), path.c_str()) != 0) checkpoint::detail::sys_fail(where, cat("cannot rename ", tmp), errno);
  } catch (...) {
    std::remove(tmp.c_str());
    throw;
  }
}

// The model a checkpoint's logits come from: GPT-2's or Llama's, by its record.
template <class Model>
void write_logits(const std::string& checkpoint, const std::string& path, const std::vector<std::int32_t>& ids,
                  const typename Model::config_type& c) {
  const std::int64_t n = static_cast<std::int64_t>(ids.size());
  std::vector<float> logits;
  run_threads(1, [&](ThreadComm& world) {
    Host dev;
    Mesh mesh{world, {}};
    Model model(dev, c, mesh.spread(), 1);
    auto dp = optim::data_parallel<optim::Ddp>(model, optim::AdamW{}, mesh);
    checkpoint::load(checkpoint, model, dp, mesh, {.optimizer = false});
    // Causal: the first n positions' logits do not depend on what follows; pad with token 0.
    std::vector<std::int32_t> tokens(static_cast<std::size_t>(c.seq), 0), targets(tokens.size(), 0);
    std::copy(ids.begin(), ids.end(), tokens.begin());
    auto ctx = model.context({tokens, targets, 1});
    pipeline::forward(model, ctx, mesh, dp, nn::Mode::infer);
    const auto all = ctx.head.ce.logits.to_host();  // (1, T, Vp)
    const std::int64_t vp = all.size() / static_cast<std::size_t>(c.seq);
    for (std::int64_t t = 0; t < n; ++t)
      for (std::int64_t v = 0; v < c.vocab; ++v) logits.push_back(all[static_cast<std::size_t>(t * vp + v)]);
  });
  write_out(path, checkpoint, std::as_bytes(std::span<const float>(logits)));
  std::printf("logits: %lld x %lld f32 to %s\n", static_cast<long long>(n), static_cast<long long>(c.vocab), path.c_str());
}

// The checkpoint's model family: the manifest's, or for a checkpoint from before weft recorded it,
// Llama's record (it has kv_heads) or GPT-2's.
std::string family_of(const checkpoint::Manifest& m) {
  if (!m.family.empty()) return m.family;
  return m.model.contains("kv_heads") ? "llama" : "gpt2";
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"weft-export: a weft checkpoint (GPT-2 or Llama) in Hugging Face's form"};
  std::string checkpoint, out, tokens, logits, dtype = "f32";
  std::uint64_t max_shard_bytes = 5'000'000'000;
  app.add_option("--checkpoint", checkpoint, "a checkpoint: a step directory, or a directory with latest")->required();
  app.add_option("--out", out, "GPT-2: the safetensors file to write (config.json goes beside it); Llama: the directory")
      ->required();
  app.add_option("--dtype", dtype, "Llama: the weights' dtype, f32 or f64 (exact)")->check(CLI::IsMember({"f32", "f64"}));
  app.add_option("--max-shard-bytes", max_shard_bytes, "Llama: the largest weights file; more are sharded (default 5 GB)")
      ->check(examples::at_least(1));
  app.add_option("--tokens", tokens, "comma-separated token ids to compute logits for");
  app.add_option("--logits", logits, "where to write the logits of --tokens (f32, tokens x vocab)");
  if (const auto stop = examples::parse(app, argc, argv)) return *stop;
  try {
    if (logits.empty() != tokens.empty())
      throw Error("weft-export", "--tokens without --logits, or --logits without --tokens", "give both, or neither");
    const checkpoint::Reader r(checkpoint);
    if (!logits.empty())  // refused before anything is written
      checkpoint::refuse_inside(std::filesystem::path(logits).parent_path().string(), checkpoint, cat("weft-export --logits ", logits));
    const std::string family = family_of(r.manifest());
    if (family != "gpt2" && family != "llama")
      throw Error("weft-export", cat("the checkpoint ", r.dir(), " holds a model of the family '", family, "', which has no Hugging Face export here"),
                  "export checkpoints of the families gpt2 and llama");
    if (family == "llama") {
      const auto c = llama::config_of(r.manifest());
      llama::export_hf(checkpoint, out, dtype == "f64" ? DType::f64 : DType::f32, max_shard_bytes);
      std::printf("exported step %lld of %s (llama: layers %lld, heads %lld over %lld key-value heads, width %lld, hidden %lld, "
                  "seq %lld, vocab %lld%s) to %s in %s\n",
                  static_cast<long long>(r.manifest().step), r.dir().c_str(), static_cast<long long>(c.layers),
                  static_cast<long long>(c.heads), static_cast<long long>(c.kv_heads), static_cast<long long>(c.width),
                  static_cast<long long>(c.hidden), static_cast<long long>(c.seq), static_cast<long long>(c.vocab),
                  c.tied ? ", head tied" : "", out.c_str(), dtype.c_str());
      if (!logits.empty()) {
        const auto ids = parse_tokens(tokens, c.vocab, c.seq);
        if (c.tied) write_logits<llama::Model<float, false, recompute::None, Host, true>>(checkpoint, logits, ids, c);
        else write_logits<llama::Model<float>>(checkpoint, logits, ids, c);
      }
      return 0;
    }
    if (dtype != "f32" || app.count("--max-shard-bytes"))
      throw Error("weft-export", "--dtype and --max-shard-bytes are for Llama checkpoints; this one is GPT-2's",
                  "leave them out (GPT-2 is exported in F32, as one file)");
    gpt2::export_hf(checkpoint, out);
    const auto c = gpt2::config_of(r.manifest());
    std::printf("exported step %lld of %s (layers %lld, heads %lld, width %lld, seq %lld, vocab %lld) to %s\n",
                static_cast<long long>(r.manifest().step), r.dir().c_str(), static_cast<long long>(c.layers),
                static_cast<long long>(c.heads), static_cast<long long>(c.width), static_cast<long long>(c.seq),
                static_cast<long long>(c.vocab), out.c_str());
    if (!logits.empty()) write_logits<gpt2::Model<float>>(checkpoint, logits, parse_tokens(tokens, c.vocab, c.seq), c);
  } catch (const Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
  return 0;
}
