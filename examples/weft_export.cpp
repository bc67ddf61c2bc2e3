// weft-export: a weft checkpoint (any mesh, strategy and precision) in Hugging Face's form, through
// the export of the model family that saved it (the manifest's "family"; for a checkpoint from
// before weft recorded it, Llama where its record has kv_heads, else GPT-2): over the families
// examples/CMakeLists.txt lists (weft_add_family_program). GPT-2's is a safetensors file with its
// config.json beside it, loadable by transformers.GPT2LMHeadModel; Llama's a LlamaForCausalLM
// directory (F32 or F64, sharded past --max-shard-bytes as save_pretrained shards). Optionally the
// logits weft computes from it for given tokens, for tools/reference/hf_compare.py and the Llama
// trainer's test.
//
//   weft-export --checkpoint runs/a --out export/model.safetensors
//   weft-export --checkpoint runs/a --out export/model.safetensors --tokens 1,2,3 --logits export/logits.f32
//   weft-export --checkpoint runs/llama --out export/llama [--dtype f64] [--max-shard-bytes 2000000000]
//
// The logits file is float32, little-endian, (tokens, vocab) row-major: the forward of one sequence
// on one host rank in f32.
#include <weft/weft_host.hpp>

#include <weft/checkpoint/checkpoint.hpp>
#include <weft/checkpoint/export_dir.hpp>
#include <weft/optim/data_parallel.hpp>
#include <weft/pipeline/executor.hpp>
#include <weft/train/dispatch.hpp>

#include "cli.hpp"
#include "weft_families.hpp"  // generated: weft_units::families

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
    } catch (const std::exception&) { used = 0; }
    if (used != item.size() || v < 0 || v >= vocab)
      throw Error("weft-export --tokens", cat("\"", item.substr(0, 32), "\" is not a token id in [0, ", vocab, ")"),
                  "pass comma-separated ids below the vocabulary");
    out.push_back(static_cast<std::int32_t>(v));
  }
  if (out.empty() || static_cast<std::int64_t>(out.size()) > seq)
    throw Error("weft-export --tokens", cat(out.size(), " tokens for a model of ", seq, " positions"),
                cat("pass 1 to ", seq, " ids"));
  return out;
}

// Writes bytes to `path`, never inside the checkpoint: a regular file (or a new one) through
// path.tmp, fsynced, and a rename, so a full disk leaves no truncated file under the name; anything
// else (a device, a pipe) directly. Every write is checked: a write error is an Error, never exit 0.
void write_out(const std::string& path, const std::string& checkpoint, std::span<const std::byte> bytes) {
  const std::string where = cat("weft-export --logits ", path);
  checkpoint::refuse_inside(std::filesystem::path(path).parent_path().string(), checkpoint, where);
  struct stat st{};
  if (::stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode)) {
    checkpoint::detail::Fd f(path, O_WRONLY);
    f.write_all(bytes.data(), bytes.size());
    f.close();
    return;
  }
  const std::string tmp = path + ".tmp";
  try {
    checkpoint::write_synced(tmp, std::span<const std::span<const std::byte>>(&bytes, 1));
    if (std::rename(tmp.c_str(), path.c_str()) != 0)
      checkpoint::detail::sys_fail(where, cat("cannot rename ", tmp), errno);
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
    auto ctx = model.in_flight({{tokens, targets}, 1});
    pipeline::forward(model, ctx, mesh, dp, nn::Mode::infer);
    const auto all = ctx.head.ce.logits.to_host();  // (1, T, Vp)
    const std::int64_t vp = all.size() / static_cast<std::size_t>(c.seq);
    for (std::int64_t t = 0; t < n; ++t)
      for (std::int64_t v = 0; v < c.vocab; ++v) logits.push_back(all[static_cast<std::size_t>(t * vp + v)]);
  });
  write_out(path, checkpoint, std::as_bytes(std::span<const float>(logits)));
  std::printf("logits: %lld x %lld f32 to %s\n", static_cast<long long>(n), static_cast<long long>(c.vocab),
              path.c_str());
}

// The checkpoint's model family: the manifest's, or for a checkpoint from before weft recorded it,
// Llama's record (it has kv_heads) or GPT-2's.
std::string family_of(const checkpoint::Manifest& m) {
  if (!m.family.empty()) return m.family;
  return m.model.contains("kv_heads") ? "llama" : "gpt2";
}

struct Asked {
  std::string checkpoint, out, tokens, logits;
  checkpoint::ExportOptions options;
};

// The export of family F, then the logits of its model (the variant its configuration's head asks
// for, in f32 on one host rank).
template <train::Family F>
void export_as(const checkpoint::Reader& r, const Asked& a) {
  if constexpr (!requires { F::export_hf(a.checkpoint, a.out, a.options); }) {
    throw Error("weft-export",
                cat("the checkpoint ", r.dir(), " holds a model of the family '", F::name(),
                    "', which has no Hugging Face export"),
                "give the family an export_hf (docs/training.md)");
  } else {
    const auto c = F::config_of(r.manifest());
    F::export_hf(a.checkpoint, a.out, a.options);
    std::printf("exported step %lld of %s (%s: %s) to %s\n", static_cast<long long>(r.manifest().step), r.dir().c_str(),
                F::name().c_str(), train::summary<F>(c).c_str(), a.out.c_str());
    if (a.logits.empty()) return;
    const auto ids = parse_tokens(a.tokens, c.vocab, c.seq);
    train::Wanted w;
    if constexpr (requires {
                    { c.tied } -> std::convertible_to<bool>;
                  })
      w.tied = c.tied;
    const auto logits = [&]<class V>() {
      if constexpr (!V::context_parallel)  // the sequence whole, on one rank
        if (w.is<V>())
          write_logits<train::model_t<train::Bound<F, V>, float, false, Host>>(a.checkpoint, a.logits, ids, c);
    };
    [&]<class... V>(train::List<V...>) { (logits.template operator()<V>(), ...); }(train::variants_t<F>{});
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"weft-export: a weft checkpoint in Hugging Face's form, through its model family's export"};
  Asked a;
  std::string dtype;
  std::uint64_t max_shard_bytes = 0;
  app.add_option("--checkpoint", a.checkpoint, "a checkpoint: a step directory, or a directory with latest")
      ->required();
  app.add_option("--out", a.out,
                 "GPT-2: the safetensors file to write (config.json goes beside it); Llama, Mixtral: the directory")
      ->required();
  app.add_option("--dtype", dtype, "Llama, Mixtral: the weights' dtype, f32 or f64 (exact)")
      ->check(CLI::IsMember({"f32", "f64"}));
  app.add_option("--max-shard-bytes", max_shard_bytes,
                 "Llama, Mixtral: the largest weights file; more are sharded (default 5 GB)")
      ->check(examples::at_least(1));
  app.add_option("--tokens", a.tokens, "comma-separated token ids to compute logits for");
  app.add_option("--logits", a.logits, "where to write the logits of --tokens (f32, tokens x vocab)");
  if (const auto stop = examples::parse(app, argc, argv)) return *stop;
  if (!dtype.empty()) a.options.dtype = dtype == "f64" ? DType::f64 : DType::f32;
  if (app.count("--max-shard-bytes")) a.options.max_shard_bytes = max_shard_bytes;
  try {
    if (a.logits.empty() != a.tokens.empty())
      throw Error("weft-export", "--tokens without --logits, or --logits without --tokens", "give both, or neither");
    const checkpoint::Reader r(a.checkpoint);
    if (!a.logits.empty())  // refused before anything is written
      checkpoint::refuse_inside(std::filesystem::path(a.logits).parent_path().string(), a.checkpoint,
                                cat("weft-export --logits ", a.logits));
    const std::string family = family_of(r.manifest());
    const auto exported = [&]<class F>() {
      export_as<F>(r, a);
      return 0;
    };
    bool known = false;
    [&]<class... Fs>(train::List<Fs...> families) {
      known = ((Fs::name() == family) || ...);
      if (known) train::with_family(families, family, "weft-export", exported);
    }(weft_units::families{});
    if (!known)
      throw Error("weft-export",
                  cat("the checkpoint ", r.dir(), " holds a model of the family '", family,
                      "', which has no Hugging Face export here"),
                  "export it with a weft-export built with its family (examples/CMakeLists.txt, WEFT_FAMILIES)");
  } catch (const Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
  return 0;
}
