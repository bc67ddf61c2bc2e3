// Qwen3-MoE's transformers directories in and out (models/qwen3_moe/hf.hpp), against the directory
// save_pretrained wrote for the reference model (tests/fixtures/qwen3_moe/hf, float64, from
// tools/reference/qwen3_moe_reference.py): its import is the reference's weft tensors bit for bit
// (so tests/models/qwen3_moe/model.cpp's comparison with transformers holds for an imported model);
// its export in F64 is the directory's tensors bit for bit and a config.json read back as the same
// model; a config.json that disagrees with its tensors, or asks for what weft's Qwen3-MoE does not
// have, is refused by name. The same for a directory with a dense layer (tests/fixtures/qwen3_moe/
// dense/hf: mlp_only_layers [1]). tests/examples/weft_train_mixtral.py reads an export back with
// transformers' from_pretrained.
#include <doctest/doctest.h>

#include <unistd.h>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "support/hf_dir.hpp"
#include "weft/checkpoint/checkpoint.hpp"
#include "weft/checkpoint/import_dir.hpp"
#include "weft/models/qwen3_moe/hf.hpp"

using namespace weft;

namespace {

std::string fixture() { return std::string(WEFT_TEST_DATA_DIR) + "/qwen3_moe/hf"; }
std::string dense_fixture() { return std::string(WEFT_TEST_DATA_DIR) + "/qwen3_moe/dense/hf"; }

std::string scratch(const std::string& name) { return test::hf::scratch("weft_qwen3_moe_hf_", name); }

qwen3_moe::Config base() {
  qwen3_moe::Config c;
  c.seq = 8, c.seed = 3;
  return c;
}

std::string edited(const std::string& name, const std::string& key, const std::string& value) {
  return test::hf::edited_copy(fixture(), scratch(name), key, value);
}

}  // namespace

TEST_CASE("qwen3_moe: a save_pretrained directory imports to the reference's weft tensors bit for bit") {
  const std::string out = scratch("import");
  const qwen3_moe::Config c = qwen3_moe::import_hf(fixture(), out, base());
  CHECK(c.layers == 2);
  CHECK(c.width == 16);
  CHECK(c.hidden == 8);
  CHECK(c.head_dim() == 8);
  CHECK(!c.norm_topk_prob);
  CHECK(c.experts == 4);
  CHECK(c.top_k == 2);
  CHECK(c.aux_coef == 0.001);  // config.json's router_aux_loss_coef
  const int compared = test::hf::imported_equals_reference(out, std::string(WEFT_TEST_DATA_DIR) + "/qwen3_moe");
  CHECK(compared == 21);  // wte, 9 a layer, ln_f, lm_head
  std::filesystem::remove_all(out);
}

TEST_CASE("qwen3_moe: the export in F64 is the save_pretrained directory bit for bit, its config.json the same model") {
  const std::string imported = scratch("import2"), out = scratch("export");
  qwen3_moe::import_hf(fixture(), imported, base());
  qwen3_moe::export_hf(imported, out, DType::f64);
  test::hf::same_tensors(out, fixture());
  const auto j = llama::hf_detail::read_json(out + "/config.json", "test");
  CHECK(j["model_type"] == "qwen3_moe");
  CHECK(j["architectures"][0] == "Qwen3MoeForCausalLM");
  CHECK(j["num_experts"] == 4);
  CHECK(j["num_experts_per_tok"] == 2);
  CHECK(j["head_dim"] == 8);
  CHECK(j["norm_topk_prob"] == false);
  const qwen3_moe::Config back = qwen3_moe::hf_config_of(out, base()),
                          first = qwen3_moe::hf_config_of(fixture(), base());
  CHECK(qwen3_moe::record(back) == qwen3_moe::record(first));
  std::filesystem::remove_all(imported);
  std::filesystem::remove_all(out);
}

TEST_CASE(
    "qwen3_moe: a config.json that disagrees with its tensors, or asks for what weft's Qwen3-MoE lacks, is refused") {
  struct Case {
    std::string key, value, what;
  };
  for (const Case& k : std::vector<Case>{
           {"num_local_experts", "8",
            "model.layers.0.mlp.gate.weight has the shape 4x16: 4 experts, where config.json's expert count "
            "(num_experts) is 8"},
           {"num_experts", "2", "4 experts, where config.json's expert count (num_experts) is 2"},
           {"num_experts_per_tok", "5", "has 4 experts, 5 a token"},
           {"mlp_only_layers", "[1]",
            "has model.layers.1.mlp.gate.weight, a router in layer 1, which config.json makes dense"},
           {"decoder_sparse_step", "2", "a router in layer 0, which config.json makes dense"},
           {"decoder_sparse_step", "0", "a decoder sparse step of 0"},
           {"mlp_only_layers", "[5]", "mlp_only_layers names layer 5 of 2"},
           {"mlp_only_layers", "\"all\"", "has mlp_only_layers \"all\", not a list of its layers"},
           {"use_sliding_window", "true", "has use_sliding_window true"},
           {"head_dim", "7", "a head size of 7"},
           {"model_type", "\"mixtral\"", "describes a model of type \"mixtral\""},
       }) {
    INFO(k.key, " ", k.value);
    const std::string dir = edited("bad", k.key, k.value);
    CHECK_THROWS_WITH_AS(qwen3_moe::check_experts(dir, qwen3_moe::hf_config_of(dir, base())),
                         doctest::Contains(k.what.c_str()), Error);
    // The importer refuses the same directory before it writes anything.
    CHECK_THROWS_AS(qwen3_moe::import_hf(dir, dir + "/out", base()), Error);
    CHECK(!std::filesystem::exists(dir + "/out"));
    std::filesystem::remove_all(dir);
  }
}

TEST_CASE("qwen3_moe: a directory with a dense layer (mlp_only_layers) in and out bit for bit") {
  const std::string imported = scratch("dense_import"), out = scratch("dense_export");
  const qwen3_moe::Config c = qwen3_moe::import_hf(dense_fixture(), imported, base());
  CHECK(c.layers == 3);
  CHECK(c.dense_layers() == std::vector<std::int64_t>{1});
  CHECK(c.dense_width() == 24);  // intermediate_size
  CHECK(c.hidden == 8);          // moe_intermediate_size
  const int compared =
      test::hf::imported_equals_reference(imported, std::string(WEFT_TEST_DATA_DIR) + "/qwen3_moe/dense");
  CHECK(compared == 29);  // wte, 9 a sparse layer, 8 the dense one, ln_f, lm_head
  qwen3_moe::export_hf(imported, out, DType::f64);
  test::hf::same_tensors(out, dense_fixture());
  const auto j = llama::hf_detail::read_json(out + "/config.json", "test");
  CHECK(j["mlp_only_layers"] == nlohmann::json::array({1}));
  CHECK(j["decoder_sparse_step"] == 1);
  CHECK(j["intermediate_size"] == 24);
  CHECK(qwen3_moe::record(qwen3_moe::hf_config_of(out, base())) == qwen3_moe::record(c));
  // A config.json that makes no layer dense, over these tensors: layer 1 has no router.
  const std::string dir = test::hf::edited_copy(dense_fixture(), scratch("dense_bad"), "mlp_only_layers", "[]");
  CHECK_THROWS_WITH_AS(qwen3_moe::check_experts(dir, qwen3_moe::hf_config_of(dir, base())),
                       doctest::Contains("has no tensor model.layers.1.mlp.gate.weight"), Error);
  std::filesystem::remove_all(dir);
  std::filesystem::remove_all(imported);
  std::filesystem::remove_all(out);
}
