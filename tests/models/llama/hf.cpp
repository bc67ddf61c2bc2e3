// Llama against transformers: a LlamaForCausalLM written by tools/reference/llama_reference.py
// (tests/fixtures/llama_hf: GQA, llama3 rotary scaling, RMSNorm weights not ones, float64 with the
// rotary tables and norms lifted to float64) imported into weft gives transformers' logits, loss and
// every parameter's gradient, on one rank and at tensor 2 (with SP); the export is the import's
// inverse; bad model directories are refused by name. A tied one (tests/fixtures/llama_hf_tied:
// tie_word_embeddings, as Llama 3.2 1B's) the same way, its table's gradient the sum of both uses.
// WEFT_LLAMA_REFERENCE and WEFT_LLAMA_REFERENCE_TIED name other reference directories (the ctest
// "llama: transformers" regenerates them where PyTorch is installed), and WEFT_LLAMA_EXPORT_TO a
// directory to export the imported model into (for from_pretrained).
#include <doctest/doctest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <set>

#include "support/error.hpp"
#include "support/gpt_step.hpp"
#include "weft/checkpoint/checkpoint.hpp"
#include "weft/comm/mesh.hpp"
#include "weft/comm/threads/run.hpp"
#include "weft/models/llama/family.hpp"
#include "weft/models/llama/hf.hpp"
#include "weft/models/llama/model.hpp"
#include "weft/optim/data_parallel.hpp"

using namespace weft;

namespace {

std::string reference_dir(bool tied = false) {
  if (const char* d = std::getenv(tied ? "WEFT_LLAMA_REFERENCE_TIED" : "WEFT_LLAMA_REFERENCE"); d && *d) return d;
  return std::string(WEFT_TEST_DATA_DIR) + (tied ? "/llama_hf_tied" : "/llama_hf");
}

std::string scratch(const std::string& name) {
  const auto p = std::filesystem::temp_directory_path() / cat("weft_llama_hf_", ::getpid(), "_", name);
  std::filesystem::remove_all(p);
  return p.string();
}

// The reference file's tensors as doubles (F64, or I64 for the tokens).
struct Reference {
  std::map<std::string, std::vector<double>> t;
  explicit Reference(const std::string& path) {
    const auto h = checkpoint::read_header(path);
    checkpoint::detail::Fd fd(path, O_RDONLY);
    for (const auto& info : h.tensors) {
      std::vector<std::byte> raw(info.end - info.begin);
      fd.read_all_at(raw.data(), raw.size(), h.data_start + info.begin);
      std::vector<double> v(raw.size() / 8);
      REQUIRE_MESSAGE((info.dtype == DType::f64 || info.dtype == DType::i64), info.name);
      for (std::size_t i = 0; i < v.size(); ++i) {
        if (info.dtype == DType::i64) {
          std::int64_t x;
          std::memcpy(&x, raw.data() + 8 * i, 8);
          v[i] = static_cast<double>(x);
        } else {
          std::memcpy(&v[i], raw.data() + 8 * i, 8);
        }
      }
      t[info.name] = std::move(v);
    }
  }
  std::vector<std::int32_t> ints(const std::string& n) const {
    const auto& v = t.at(n);
    return {v.begin(), v.end()};
  }
};

double worst_relative(const std::vector<double>& got, const std::vector<double>& want) {
  double diff = 0, scale = 0;
  REQUIRE(got.size() == want.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    diff = test::worse(diff, std::abs(got[i] - want[i]));
    scale = std::max(scale, std::abs(want[i]));
  }
  return diff / std::max(scale, 1e-300);
}

// Every weft gradient, split into transformers' tensors (the export's mapping), against the
// reference's; returns the worst relative difference (max |diff| / max |ref| per tensor) and where.
template <class Model>
double worst_gradient(Model& model, const llama::Config& c, const Reference& ref, auto& mesh, std::string& where) {
  double worst = 0;
  const auto names = llama::hf_detail::names(c);
  model.for_each_param([&](const std::string& name, auto& p) {
    const auto t = redistribute<Replicated>(p.grad, mesh);
    std::vector<double> g(t.data(), t.data() + t.numel());
    const auto it = std::find_if(names.begin(), names.end(), [&](const auto& n) { return n.weft == name; });
    REQUIRE_MESSAGE(it != names.end(), name);
    const auto shape = llama::hf_detail::weft_shape(*it, c);
    const std::int64_t cols = shape.size() == 2 ? shape[1] : 1;
    g.resize(static_cast<std::size_t>(shape[0] * cols));  // the padded vocabulary's rows
    std::vector<std::vector<double>> parts;
    for (const auto& s : llama::hf_detail::hf_shapes(*it, c)) parts.emplace_back(static_cast<std::size_t>(s[0] * cols));
    for (std::int64_t r = 0; r < shape[0]; ++r) {
      const auto [part, row] = llama::hf_detail::source_row(*it, c, r);
      std::copy_n(g.begin() + r * cols, cols, parts[part].begin() + row * cols);
    }
    for (std::size_t part = 0; part < parts.size(); ++part) {
      const double e = worst_relative(parts[part], ref.t.at("grad/" + it->hf[part]));
      if (e > worst) {
        worst = e;
        where = it->hf[part];
      }
    }
  });
  return worst;
}

}  // namespace

TEST_CASE("Llama imported from transformers gives its logits, loss and gradients (f64 within 1e-10, f32 within 1e-5)") {
  const std::string dir = reference_dir();
  const Reference ref(dir + "/reference.safetensors");
  const auto ckpt = scratch("import");
  const llama::Config c = llama::import_hf(dir, ckpt, {.seq = 16, .seed = 5});
  CHECK(c.kv_heads < c.heads);
  CHECK(c.rope.factor > 0);
  const auto tokens = ref.ints("tokens"), targets = ref.ints("targets");
  const std::int64_t B = static_cast<std::int64_t>(tokens.size()) / c.seq;
  const double loss_ref = ref.t.at("loss")[0];

  // f64 on one rank: logits, loss and gradients. 1e-10: transformers and weft add the same
  // products in other orders (about 1e-16 each), and its float32 rotary and norms are lifted.
  run_threads(1, [&](ThreadComm& world) {
    Mesh mesh{world, {}};
    Host h;
    llama::Model<double> model(h, c, mesh.spread(), B);
    auto dp = optim::data_parallel<optim::Ddp>(model, optim::AdamW{}, mesh);
    checkpoint::load(ckpt, model, dp, mesh, {.optimizer = false});
    std::vector<double> logits;
    const double loss = test::forward_backward(model, tokens, targets, B, mesh, &logits);
    const double el = worst_relative(logits, ref.t.at("logits"));
    CHECK(el <= 1e-10);
    CHECK(std::abs(loss - loss_ref) <= 1e-10 * loss_ref);
    std::string where;
    const double eg = worst_gradient(model, c, ref, mesh, where);
    CHECK_MESSAGE(eg <= 1e-10, where);
    MESSAGE("f64, one rank: logits within ", el, " (relative to the largest), loss ", loss, " against ", loss_ref,
            ", gradients within ", eg, " (worst: ", where, ")");
  });

  // f64 at tensor 2 with SP (each rank loads its own shards): the loss and every gradient.
  std::mutex mu;
  run_threads(2, [&](ThreadComm& world) {
    Mesh mesh{world, {.tensor = 2}};
    Host h;
    llama::Model<double, true> model(h, c, mesh.spread(), B);
    auto dp = optim::data_parallel<optim::Ddp>(model, optim::AdamW{}, mesh);
    checkpoint::load(ckpt, model, dp, mesh, {.optimizer = false});
    const double loss = test::forward_backward(model, tokens, targets, B, mesh);
    std::string where;
    const double eg = worst_gradient(model, c, ref, mesh, where);
    std::lock_guard lock(mu);
    CHECK(std::abs(loss - loss_ref) <= 1e-10 * loss_ref);
    CHECK_MESSAGE(eg <= 1e-10, where);
    if (mesh.coord().tensor == 0) MESSAGE("f64, tensor 2 with SP: loss ", loss, ", gradients within ", eg);
  });

  // f32 on one rank: the logits within 1e-5 of the largest (f32 leaves about 1e-7 per operation
  // over a few hundred of them).
  run_threads(1, [&](ThreadComm& world) {
    Mesh mesh{world, {}};
    Host h;
    llama::Model<float> model(h, c, mesh.spread(), B);
    auto dp = optim::data_parallel<optim::Ddp>(model, optim::AdamW{}, mesh);
    checkpoint::load(ckpt, model, dp, mesh, {.optimizer = false});
    std::vector<float> logits;
    test::forward_backward(model, tokens, targets, B, mesh, &logits);
    const double e = worst_relative(std::vector<double>(logits.begin(), logits.end()), ref.t.at("logits"));
    CHECK(e <= 1e-5);
    MESSAGE("f32, one rank: logits within ", e);
  });

  // The export is the import's inverse: in F64, every tensor comes back bit for bit.
  const auto out = scratch("export");
  llama::export_hf(ckpt, out, DType::f64);
  const checkpoint::ImportDir original(dir, "model", "original"), exported(out, "model", "exported");
  for (const auto& n : llama::hf_detail::names(c))
    for (const auto& name : n.hf) CHECK_MESSAGE(exported.read(name) == original.read(name), name);
  const auto again = scratch("again");
  const llama::Config c2 = llama::import_hf(out, again, {.seq = 16, .seed = 5});
  CHECK(llama::record(c2) == llama::record(c));
  // Sharded as save_pretrained shards (files of at most 20000 bytes here; the model's F64 weights
  // take several, the 15616-byte embedding table alone in one), streamed one tensor at a time, into
  // the directory of the single-file export (whose model.safetensors it replaces): the same tensors,
  // bit for bit, read through the index.
  llama::export_hf(ckpt, out, DType::f64, 20000);
  CHECK(!std::filesystem::exists(out + "/model.safetensors"));
  const auto index = llama::hf_detail::read_json(out + "/model.safetensors.index.json", "test");
  std::set<std::string> shards;
  std::uint64_t total = 0;
  for (const auto& [name, file] : index["weight_map"].items()) {
    shards.insert(file.get<std::string>());
    const auto* t = exported.find(name);  // the single file's header (read before): the tensor's size
    REQUIRE(t);
    total += t->end - t->begin;
  }
  CHECK(index["metadata"]["total_size"].get<std::uint64_t>() == total);
  for (const auto& f : shards) CHECK(std::filesystem::file_size(out + "/" + f) <= 20000 + 4096);  // the header beside
  CHECK(shards.size() >= 4);
  const checkpoint::ImportDir sharded(out, "model", "sharded");
  for (const auto& n : llama::hf_detail::names(c))
    for (const auto& name : n.hf) CHECK_MESSAGE(sharded.read(name) == original.read(name), name);
  if (const char* to = std::getenv("WEFT_LLAMA_EXPORT_TO"); to && *to) {  // for transformers_check.py
    llama::export_hf(ckpt, cat(to, "/one-file"), DType::f32);
    llama::export_hf(ckpt, cat(to, "/sharded"), DType::f32, 20000);
  }
  for (const auto& d : {ckpt, out, again}) std::filesystem::remove_all(d);
}

TEST_CASE(
    "a tied Llama (tie_word_embeddings) imported from transformers gives its logits, loss and gradients (f64 within 1e-10)") {
  const std::string dir = reference_dir(true);
  const Reference ref(dir + "/reference.safetensors");
  const auto ckpt = scratch("import_tied");
  const llama::Config c = llama::import_hf(dir, ckpt, {.seq = 16, .seed = 5});
  REQUIRE(c.tied);
  CHECK(ref.t.count("grad/lm_head.weight") == 0);  // one table: its gradient is embed_tokens'
  const auto tokens = ref.ints("tokens"), targets = ref.ints("targets");
  const std::int64_t B = static_cast<std::int64_t>(tokens.size()) / c.seq;
  const double loss_ref = ref.t.at("loss")[0];
  // One rank, then tensor 2 with SP (the table's rows and the head's columns sharded alike): 1e-10
  // as for the untied model (the same sums in other orders).
  std::mutex mu;
  for (const int tensor : {1, 2})
    run_threads(tensor, [&](ThreadComm& world) {
      Mesh mesh{world, {.tensor = tensor}};
      Host h;
      auto check = [&](auto& model) {
        auto dp = optim::data_parallel<optim::Ddp>(model, optim::AdamW{}, mesh);
        checkpoint::load(ckpt, model, dp, mesh, {.optimizer = false});
        std::vector<double> logits;
        const double loss = test::forward_backward(model, tokens, targets, B, mesh, tensor == 1 ? &logits : nullptr);
        std::string where;
        const double eg = worst_gradient(model, c, ref, mesh, where);
        std::lock_guard lock(mu);
        if (tensor == 1) {
          const double el = worst_relative(logits, ref.t.at("logits"));
          CHECK(el <= 1e-10);
          MESSAGE("tied, f64, one rank: logits within ", el, ", loss ", loss, " against ", loss_ref,
                  ", gradients within ", eg, " (worst: ", where, ")");
        } else if (mesh.coord().tensor == 0) {
          MESSAGE("tied, f64, tensor 2 with SP: loss ", loss, ", gradients within ", eg, " (worst: ", where, ")");
        }
        CHECK(std::abs(loss - loss_ref) <= 1e-10 * loss_ref);
        CHECK_MESSAGE(eg <= 1e-10, where);
      };
      if (tensor == 1) {
        llama::Model<double, false, recompute::None, Host, true> model(h, c, mesh.spread(), B);
        check(model);
      } else {
        llama::Model<double, true, recompute::None, Host, true> model(h, c, mesh.spread(), B);
        check(model);
      }
    });
  std::filesystem::remove_all(ckpt);
}

TEST_CASE(
    "a transformers Llama directory that weft cannot read is refused, naming the tensor or field and the values") {
  const std::string dir = reference_dir();
  const checkpoint::ImportDir files(dir, "model", "files");
  const auto bad = scratch("bad");
  auto config = llama::hf_detail::read_json(dir + "/config.json", "test");
  // Writes the model with `drop` left out, `extra` added and `retype` as I32, and config.json edited.
  auto write = [&](const std::string& drop, const std::string& extra, const std::string& retype,
                   const nlohmann::json& cfg) {
    std::filesystem::remove_all(bad);
    std::filesystem::create_directories(bad);
    std::vector<std::vector<double>> data;
    std::vector<std::vector<std::int32_t>> ints;
    std::vector<checkpoint::TensorData> ts;
    const auto names = files.names();
    data.reserve(names.size() + 1);
    ints.reserve(1);
    for (const auto& n : names) {
      if (n == drop) continue;
      data.push_back(files.read(n));
      const auto* info = files.find(n);
      if (n == retype) {
        ints.emplace_back(data.back().size(), 1);
        ts.push_back({n, DType::i32, info->shape, ints.back().data()});
      } else {
        ts.push_back({n, DType::f64, info->shape, data.back().data()});
      }
    }
    if (!extra.empty()) {
      data.push_back(std::vector<double>(4, 0.0));
      ts.push_back({extra, DType::f64, {4}, data.back().data()});
    }
    checkpoint::write(bad + "/model.safetensors", ts);
    std::ofstream(bad + "/config.json") << cfg.dump();
  };
  auto refused = [&](const std::string& what) {
    CHECK_THROWS_WITH_AS(llama::import_hf(bad, bad + "/out"), doctest::Contains(what.c_str()), Error);
  };
  write("model.layers.1.self_attn.k_proj.weight", "", "", config);
  refused("has no tensor model.layers.1.self_attn.k_proj.weight");
  write("", "model.layers.2.mlp.up_proj.weight", "", config);
  refused("has a tensor model.layers.2.mlp.up_proj.weight that a Llama of 2 layers does not have");
  write("", "", "model.norm.weight", config);
  refused("model.norm.weight has dtype I32");
  auto wider = config;
  wider["intermediate_size"] = 64;
  write("", "", "", wider);
  refused("model.layers.0.mlp.gate_proj.weight has the shape 48x32; config.json's sizes give 64x32");
  auto kv = config;
  kv["num_key_value_heads"] = 3;
  write("", "", "", kv);
  refused("3 key-value heads do not divide 4 heads");
  auto scaling = config;
  scaling["rope_parameters"]["rope_type"] = "yarn";
  write("", "", "", scaling);
  refused("has the rotary scaling \"yarn\"");
  // Garbage is refused by name, never read as a default: a string where the rotary scaling's object
  // belongs (read as none, the model trained unscaled), a string for tie_word_embeddings (read as
  // false), a size past int64 (it wrapped to -9223372036854775808).
  for (const char* k : {"rope_parameters", "rope_scaling"}) {
    auto text = config;
    text[k] = "llama3";
    write("", "", "", text);
    refused(cat("has ", k, " \"llama3\", not an object"));
  }
  auto yes = config;
  yes["tie_word_embeddings"] = "yes";
  write("", "", "", yes);
  refused("has tie_word_embeddings \"yes\", not true or false");
  auto huge = config;
  huge["num_hidden_layers"] = std::uint64_t{1} << 63;
  write("", "", "", huge);
  refused("has num_hidden_layers 9223372036854775808, past the largest 64-bit integer");
  // config.json's layers against the tensors the files hold, before the table of names is built
  // (10^7 layers ran out of memory).
  auto deep = config;
  deep["num_hidden_layers"] = 10'000'000;
  write("", "", "", deep);
  refused("tensors, too few for config.json's 10000000 layers of 9 each");
  auto legacy = config;  // transformers 4.x keys: read the same
  legacy.erase("rope_parameters");
  legacy["rope_theta"] = 500.0;
  legacy["rope_scaling"] = {{"rope_type", "llama3"},
                            {"factor", 4.0},
                            {"low_freq_factor", 1.0},
                            {"high_freq_factor", 4.0},
                            {"original_max_position_embeddings", 32}};
  write("", "", "", legacy);
  const llama::Config a = llama::import_hf(bad, bad + "/out"), b = llama::import_hf(dir, bad + "/out2");
  CHECK(llama::record(a) == llama::record(b));
  std::filesystem::remove_all(bad);
}

TEST_CASE("--init-from compares config.json with the run before it converts anything") {
  // A directory whose config.json describes another model (its rotary base) and whose weights are
  // garbage: the run's family names the config.json's field, never the weights (which it would
  // have read and converted first, minutes and gigabytes for a large model).
  const auto dir = scratch("init_mismatch");
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  auto config = llama::hf_detail::read_json(reference_dir() + "/config.json", "test");
  const llama::Config run = llama::hf_config_of(reference_dir());
  config["rope_parameters"]["rope_theta"] = 123.0;
  std::ofstream(dir + "/config.json") << config.dump();
  std::ofstream(dir + "/model.safetensors") << "not a safetensors file";
  CHECK_THROWS_WITH_AS(
      llama::Family::import_hf(dir, dir + "/out", run),
      doctest::Contains("its config.json has rope_theta_x1e6 123000000; the run's model has 500000000"), Error);
  CHECK(!std::filesystem::exists(dir + "/out"));
  std::filesystem::remove_all(dir);
}
