// Hugging Face GPT-2 export and import (models/gpt2/hf.hpp): a checkpoint of a tensor-parallel
// ZeRO-1 run exported and imported back gives its parameters bit for bit; the exported file has
// GPT-2's names, shapes and layouts (Conv1D weights transposed, c_attn's columns ordered q|k|v then
// head); a run initialized from the import trains exactly as one loading the checkpoint's weights.
// (The comparison of logits with transformers itself: tests/examples/gpt2_transformers.py, through
// tools/reference/hf_compare.py, a CTest test skipped without PyTorch.)
#include <doctest/doctest.h>

#include "checkpoint/support.hpp"
#include "weft/models/gpt2/hf.hpp"

using namespace weft;
using namespace weft::test;

TEST_CASE("GPT-2 export and import round trip, with Hugging Face's names and layouts") {
  const gpt2::Config c = ckpt_config();  // vocab 30, seq 16, 2 layers, 4 heads, width 32
  const std::string ck = scratch("gpt2_ck"), out = scratch("gpt2_export"), back = scratch("gpt2_import");
  ckpt_run<float, optim::Zero1>({.data = 2, .tensor = 2}, RunPlan::fresh(ck, 3));
  std::filesystem::create_directories(out);
  gpt2::export_hf(ck, out + "/model.safetensors");
  CHECK(std::filesystem::exists(out + "/config.json"));

  // Names, shapes, layouts.
  const auto h = checkpoint::read_header(out + "/model.safetensors");
  CHECK(h.tensors.size() == 2 + 12 * 2 + 2);
  const auto* attn = h.find("transformer.h.1.attn.c_attn.weight");
  REQUIRE(attn);
  CHECK(attn->shape == std::vector<std::int64_t>{32, 96});
  CHECK(h.find("transformer.h.0.mlp.c_proj.weight")->shape == std::vector<std::int64_t>{128, 32});
  CHECK(h.find("transformer.wte.weight")->shape == std::vector<std::int64_t>{30, 32});
  const checkpoint::Reader r(ck);
  const auto qkv = r.read<float>("param/h1.attn.qkv.weight");  // (3C, C), rows (head, {q,k,v}, hd)
  std::vector<float> hf(32 * 96);
  checkpoint::read_bytes(out + "/model.safetensors", h, attn->begin, attn->end - attn->begin, hf.data());
  const int C = 32, hd = 8;
  int checked = 0;
  for (int s = 0; s < 3; ++s)
    for (int head = 0; head < 4; ++head)
      for (int d = 0; d < hd; d += 3)
        for (int i = 0; i < C; i += 5) {
          const int j = s * C + head * hd + d, row = head * 3 * hd + s * hd + d;  // HF column j, weft row
          CHECK(hf[static_cast<std::size_t>(i * 96 + j)] == qkv[static_cast<std::size_t>(row * C + i)]);
          ++checked;
        }
  CHECK(checked == 3 * 4 * 3 * 7);

  // Import: the same parameters, bit for bit.
  gpt2::import_hf(out + "/model.safetensors", back, c);
  CHECK(compare_checkpoints(ck, back, false) == "");

  // A run from the imported weights trains as one from the checkpoint's weights.
  RunPlan from_import{back, "", 2, 20, false, 0, 0, false}, from_checkpoint{ck, "", 2, 20, false, 0, 0, false};
  const auto a = ckpt_run<float, optim::Fsdp>({.data = 2}, from_import);
  const auto b = ckpt_run<float, optim::Fsdp>({.data = 2}, from_checkpoint);
  REQUIRE(a.size() == 2);
  CHECK(a == b);

  // A file of other sizes is refused, naming the tensor and both shapes.
  gpt2::Config wider = c;
  wider.width = 64;
  std::string got;
  try {
    gpt2::import_hf(out + "/model.safetensors", scratch("gpt2_wider"), wider);
  } catch (const Error& e) { got = e.what(); }
  CHECK(got.find("transformer.wte.weight has the shape 30x32; a GPT-2 of these sizes has 30x64") != std::string::npos);

  // What the shapes cannot tell: a deeper file into fewer layers (before, the extra blocks were
  // dropped silently), another head count (c_attn is (C, 3C) for any: before, its columns were
  // permuted by the wrong heads), a file without its config.json.
  auto refused = [&](const gpt2::Config& cfg, const std::string& file, const std::string& expect) {
    std::string e;
    try {
      gpt2::import_hf(file, scratch("gpt2_refused"), cfg);
    } catch (const Error& err) { e = err.what(); }
    CAPTURE(e);
    CHECK(e.find(expect) != std::string::npos);
  };
  gpt2::Config shallow = c, fewer_heads = c;
  shallow.layers = 1;
  fewer_heads.heads = 2;
  refused(shallow, out + "/model.safetensors",
          "has a tensor transformer.h.1.ln_1.weight that a GPT-2 of 1 layers, 4 heads and width 32 does not have");
  refused(fewer_heads, out + "/model.safetensors", "config.json): has n_head 4; this model has 2");
  const std::string bare = scratch("gpt2_bare");
  std::filesystem::create_directories(bare);
  std::filesystem::copy_file(out + "/model.safetensors", bare + "/model.safetensors");
  refused(c, bare + "/model.safetensors", "has no config.json beside it");
  for (const auto& d : {ck, out, back, bare}) std::filesystem::remove_all(d);
}
