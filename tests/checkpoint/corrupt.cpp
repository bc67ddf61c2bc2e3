// Corrupt checkpoints: each of 30 handcrafted faults in a valid checkpoint (its files, its manifest,
// its latest pointer, the model it is loaded into) is refused with its own message, naming the file
// or the tensor and the expected against the actual value. Nothing is loaded from a checkpoint that
// fails a check (load() verifies everything before it writes into the model).
#include <doctest/doctest.h>

#include <sys/stat.h>

#include <chrono>
#include <fstream>
#include <iterator>

#include "checkpoint/support.hpp"

using namespace weft;
using namespace weft::test;
namespace fs = std::filesystem;

namespace {

// A valid checkpoint of a data 2 x tensor 2 ZeRO-1 run after one step, made once.
const std::string& valid() {
  static const std::string root = [] {
    const std::string r = scratch("corrupt_valid");
    ckpt_run<float, optim::Zero1>({.data = 2, .tensor = 2}, RunPlan::fresh(r, 1));
    return r;
  }();
  return root;
}

std::string copy_of_valid(const std::string& name) {
  const std::string dir = scratch("corrupt_" + name);
  fs::copy(valid(), dir, fs::copy_options::recursive);
  return dir;
}

std::string step_dir(const std::string& root) { return root + "/step_00000001"; }

nlohmann::json read_manifest(const std::string& root) {
  std::ifstream in(step_dir(root) + "/manifest.json");
  return nlohmann::json::parse(in);
}
void write_manifest(const std::string& root, const nlohmann::json& j) {
  std::ofstream(step_dir(root) + "/manifest.json") << j.dump(1);
}
void write_text(const std::string& path, const std::string& text) { std::ofstream(path, std::ios::trunc) << text; }

void flip_byte(const std::string& path, std::uint64_t at) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(static_cast<std::streamoff>(at));
  char c = 0;
  f.get(c);
  f.seekp(static_cast<std::streamoff>(at));
  f.put(static_cast<char>(c ^ 0x40));
}

// Opening (and reading `tensor` when given) fails with a message containing `expect`.
void refused(const std::string& root, const std::string& expect, const std::string& tensor = "") {
  CAPTURE(expect);
  std::string got;
  try {
    const checkpoint::Reader r(root);
    if (!tensor.empty()) (void)r.read<float>(tensor);
  } catch (const Error& e) { got = e.what(); }
  CAPTURE(got);
  CHECK(got.find(expect) != std::string::npos);
}

// Edits the manifest and expects `expect`.
template <class F>
void manifest_refused(const std::string& name, F&& edit, const std::string& expect, const std::string& tensor = "") {
  const std::string d = copy_of_valid(name);
  auto j = read_manifest(d);
  edit(j);
  write_manifest(d, j);
  refused(d, expect, tensor);
  fs::remove_all(d);
}

const std::string kRank1 = "rank_00001.safetensors";

}  // namespace

TEST_CASE("a valid checkpoint opens, and every tensor reads") {
  const checkpoint::Reader r(valid());
  CHECK(r.manifest().step == 1);
  CHECK(r.manifest().files().size() == 4);
  CHECK(r.shape("param/wte") == std::vector<std::int64_t>{30, 32});  // the padded rows are not part of it
  CHECK(r.has("exp_avg_sq/h1.mlp.fc.weight"));
  for (const auto& [name, t] : r.manifest().tensors) CHECK(!r.read<float>(name).empty());
}

TEST_CASE("corrupt files are refused by size or hash") {
  SUBCASE("a flipped byte in a tensor's data") {
    const std::string d = copy_of_valid("flip_data");
    flip_byte(step_dir(d) + "/" + kRank1, fs::file_size(step_dir(d) + "/" + kRank1) - 5);
    refused(d, "rank_00001.safetensors): has xxh3 ");
    refused(d, "; the manifest expects ");
  }
  SUBCASE("a flipped byte in a file's header") {
    const std::string d = copy_of_valid("flip_header");
    flip_byte(step_dir(d) + "/" + kRank1, 20);
    refused(d, "rank_00001.safetensors): has xxh3 ");
  }
  SUBCASE("a truncated file") {
    const std::string d = copy_of_valid("truncated");
    const auto path = step_dir(d) + "/" + kRank1;
    const auto n = fs::file_size(path);
    fs::resize_file(path, n - 100);
    refused(d, cat("rank_00001.safetensors): has ", n - 100, " bytes; the manifest expects ", n));
  }
  SUBCASE("a byte appended") {
    const std::string d = copy_of_valid("appended");
    const auto path = step_dir(d) + "/" + kRank1;
    const auto n = fs::file_size(path);
    std::ofstream(path, std::ios::app | std::ios::binary) << 'x';
    refused(d, cat("has ", n + 1, " bytes; the manifest expects ", n));
  }
  SUBCASE("a missing file") {
    const std::string d = copy_of_valid("missing_file");
    fs::remove(step_dir(d) + "/" + kRank1);
    refused(d, "rank_00001.safetensors): is missing");
  }
}

TEST_CASE("corrupt manifests are refused, each with its message") {
  SUBCASE("not JSON") {
    const std::string d = copy_of_valid("not_json");
    write_text(step_dir(d) + "/manifest.json", "{\"format\": ");
    refused(d, "manifest.json): is not valid JSON");
  }
  manifest_refused("format", [](auto& j) { j["format"] = "pytorch"; }, "is not a weft checkpoint manifest");
  manifest_refused("version", [](auto& j) { j["version"] = 2; }, "has version 2; this weft reads version 1");
  manifest_refused("no_tensors", [](auto& j) { j.erase("tensors"); }, "has a missing or mistyped field");
  manifest_refused("step", [](auto& j) { j["step"] = -1; }, "has step -1");
  // A float where an integer belongs would convert out of range (undefined behaviour the manifest
  // fuzzer found, f844497): refused, in a scalar field and in a list of them.
  manifest_refused("float_step", [](auto& j) { j["step"] = 7.7e43; }, "has 7.7e+43 where an integer belongs");
  manifest_refused(
      "float_dim", [](auto& j) { j["tensors"].begin().value()["global"][0] = 7.7e43; },
      "has 7.7e+43 where an integer belongs");
  manifest_refused("mesh", [](auto& j) { j["mesh"]["tensor"] = 0; }, "each must be >= 1");
  manifest_refused("policy", [](auto& j) { j["policy"] = "scattered"; }, "has policy \"scattered\"");
  manifest_refused("xxh3", [](auto& j) { j["files"][0]["xxh3"] = "xyz"; }, "has a malformed xxh3 \"xyz\"");
  manifest_refused(
      "traversal", [](auto& j) { j["files"][0]["name"] = "../rank_00000.safetensors"; }, "outside its directory");
  manifest_refused(
      "file_twice", [](auto& j) { j["files"].push_back(j["files"][0]); },
      "lists the file rank_00000.safetensors twice");
  manifest_refused(
      "dtype", [](auto& j) { j["tensors"]["param/wpe"]["dtype"] = "F8"; }, "tensor param/wpe has dtype \"F8\"");
  manifest_refused(
      "rank0", [](auto& j) { j["tensors"]["param/wpe"]["global"] = nlohmann::json::array(); },
      "tensor param/wpe has a global shape [] of no, too many or too large dims");
  manifest_refused(
      "overflow", [](auto& j) { j["tensors"]["param/wpe"]["global"] = {std::int64_t{1} << 40, std::int64_t{1} << 40}; },
      "of no, too many or too large dims");
  manifest_refused(
      "logical", [](auto& j) { j["tensors"]["param/wte"]["logical"] = {40, 32}; },
      "has a logical shape [40,32] outside its global shape");
  manifest_refused(
      "box", [](auto& j) { j["tensors"]["param/wte"]["pieces"][0]["box_offset"] = {31, 0}; },
      "leaves the global shape");
  manifest_refused(
      "range", [](auto& j) { j["tensors"]["param/wpe"]["pieces"][0]["count"] = 100000; }, "outside its box of");
  manifest_refused(
      "unlisted", [](auto& j) { j["tensors"]["param/wpe"]["pieces"][0]["file"] = "rank_00009.safetensors"; },
      "which is not among the files");
  // A piece dropped, or listed twice, or a tensor dropped: the file records what the manifest lacks
  // (or not what it adds), so the file check refuses it before coverage would.
  manifest_refused(
      "missing_piece", [](auto& j) { j["tensors"]["param/wte"]["pieces"].erase(0); },
      "rank_00000.safetensors): the file records ");
  manifest_refused(
      "missing_piece", [](auto& j) { j["tensors"]["param/wte"]["pieces"].erase(0); }, "pieces; the manifest places ");
  manifest_refused(
      "twice", [](auto& j) { j["tensors"]["param/wpe"]["pieces"].push_back(j["tensors"]["param/wpe"]["pieces"][0]); },
      "pieces; the manifest places ");
  manifest_refused(
      "no_tensor", [](auto& j) { j["tensors"].erase("param/wpe"); }, "pieces; the manifest places ", "param/wpe");
  manifest_refused(
      "key", [](auto& j) { j["tensors"]["param/wpe"]["pieces"][0]["key"] = "param/elsewhere"; },
      "the manifest places a piece of param/wpe under the key param/elsewhere, which the file does not record",
      "param/wpe");
  manifest_refused(
      "dtype_mismatch", [](auto& j) { j["tensors"]["param/wpe"]["dtype"] = "BF16"; },
      "the manifest's piece of param/wpe under the key param/wpe differs from the file's record of it in its dtype",
      "param/wpe");
}

TEST_CASE("coverage: a tensor's pieces cover it exactly once (checked after the files)") {
  // On the manifest alone (a load reaches it only once the files agree with the manifest).
  std::ifstream in(step_dir(valid()) + "/manifest.json");
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto check = [&](auto edit, const std::string& expect) {
    checkpoint::Manifest m = checkpoint::parse(text, "valid");
    edit(m);
    std::string got;
    try {
      checkpoint::check_coverage(m, "edited");
    } catch (const Error& e) { got = e.what(); }
    CAPTURE(got);
    CHECK(got.find(expect) != std::string::npos);
  };
  check([](checkpoint::Manifest& m) { m.tensors["param/wte"].pieces.erase(m.tensors["param/wte"].pieces.begin()); },
        "tensor param/wte: elements [");
  check([](checkpoint::Manifest& m) { m.tensors["param/wte"].pieces.erase(m.tensors["param/wte"].pieces.begin()); },
        "are in no piece");
  check([](checkpoint::Manifest& m) { m.tensors["param/wpe"].pieces.push_back(m.tensors["param/wpe"].pieces[0]); },
        "are held by two pieces");
  checkpoint::check_coverage(checkpoint::parse(text, "valid"), "valid");  // and the valid one passes
}

TEST_CASE("directories without a complete checkpoint are refused") {
  SUBCASE("no manifest (a save cut before it)") {
    const std::string d = copy_of_valid("no_manifest");
    fs::remove(step_dir(d) + "/manifest.json");
    refused(step_dir(d), "has no manifest.json and no latest pointer");
    refused(d, "latest names step_00000001, which has no manifest.json");
  }
  SUBCASE("latest pointing outside") {
    const std::string d = copy_of_valid("latest_outside");
    write_text(d + "/latest", "../../etc\n");
    refused(d, "its latest pointer holds \"../../etc\", not a step directory");
  }
  SUBCASE("an unfinished .tmp directory") {
    const std::string d = copy_of_valid("tmp_dir");
    fs::create_directories(d + "/step_00000002.tmp");
    refused(d + "/step_00000002.tmp", "is an unfinished save");
    CHECK(checkpoint::Reader(d).manifest().step == 1);  // latest is untouched by it
  }
  SUBCASE("not a directory") { refused(valid() + "/nothing_here", "is not a directory"); }
}

TEST_CASE("a checkpoint of other sizes is refused when loaded into a model, naming the field") {
  // Resumes a copy of the valid checkpoint into a model of other sizes; the Error's text.
  auto resumed = [](const std::string& name, auto change) {
    const std::string d = copy_of_valid(name);
    gpt2::Config c = ckpt_config();
    change(c);
    std::string got;
    try {
      ckpt_run<float, optim::Zero1>({.data = 2, .tensor = 2}, RunPlan::resumed(d, "", 2), c);
    } catch (const Error& e) { got = e.what(); }
    fs::remove_all(d);
    return got;
  };
  const std::string wider = resumed("other_sizes", [](gpt2::Config& c) { c.width = 64; });
  CAPTURE(wider);
  CHECK(wider.find("was saved from a model with width = 32; this model has width = 64") != std::string::npos);
  // A 2-layer checkpoint into one layer: before, the model took the first block silently.
  const std::string shallower = resumed("record", [](gpt2::Config& c) { c.layers = 1; });
  CAPTURE(shallower);
  CHECK(shallower.find("was saved from a model with layers = 2; this model has layers = 1") != std::string::npos);
  CHECK(shallower.find("the previous checkpoint is unchanged") == std::string::npos);  // a save's wording
}

// Loads trust nothing beyond what the hashes cover: the pieces the manifest places in a file are
// checked against the file's own records of them (its weft.pieces metadata, covered by its hash).
TEST_CASE("a manifest that places pieces differently from their files is refused") {
  // The pieces of two tensors of one shape swapped (each file's records say otherwise): loaded as
  // is, h0.ln1's weight would get its bias's values.
  manifest_refused(
      "swapped",
      [](auto& j) {
        std::swap(j["tensors"]["param/h0.ln1.weight"]["pieces"], j["tensors"]["param/h0.ln1.bias"]["pieces"]);
      },
      "differs from the file's record of it in its tensor (the file records a piece of param/h0.ln1.");
  manifest_refused(
      "moved_box",
      [](nlohmann::json& j) {
        // wte (30, 32) is Shard<0> over tensor 2: a piece's box starts at row 0 or 15.
        auto& offset = j["tensors"]["param/wte"]["pieces"][0]["box_offset"];
        offset[0] = offset[0].get<std::int64_t>() == 0 ? 15 : 0;
      },
      "differs from the file's record of it in its box offset");
  manifest_refused(
      "unlisted_piece",
      [](auto& j) {
        // One piece dropped, and another stretched to keep the coverage whole: still not the file's.
        auto& p = j["tensors"]["param/wpe"]["pieces"];
        p.erase(p.size() - 1);
      },
      "pieces; the manifest places");
}

TEST_CASE("run and optimizer fields out of range are refused") {
  manifest_refused(
      "run_step_negative", [](auto& j) { j["run"]["step"] = -1; },
      "has run.step -1; expected an integer in [0, 9007199254740992]");
  manifest_refused("run_step_other", [](auto& j) { j["run"]["step"] = 7; }, "has run.step 7 but step 1");
  manifest_refused(
      "step_huge", [](auto& j) { j["step"] = std::int64_t{1} << 60; },
      "has step 1152921504606846976; expected an integer in [0, ");
  manifest_refused("steps_negative", [](auto& j) { j["optimizer"]["steps"] = -3; }, "has optimizer.steps -3");
  manifest_refused(
      "skipped_over", [](auto& j) { j["optimizer"]["skipped"] = 2; },
      "has optimizer.skipped 2; expected an integer in [0, 1]");
  manifest_refused(
      "position_negative", [](auto& j) { j["run"]["loader_position"] = -1; }, "has run.loader_position -1");
  manifest_refused("position_float", [](auto& j) { j["run"]["loader_position"] = 1.5; }, "has run.loader_position 1.5");
  manifest_refused(
      "seed_negative", [](auto& j) { j["run"]["seed"] = -11; }, "has run.seed -11; expected an integer in [0, 2^64)");
  manifest_refused("no_rule", [](auto& j) { j["optimizer"].erase("rule"); }, "has a missing or mistyped field");
  // A manifest of another step in a directory named for step 1 (a copy renamed by hand, say).
  manifest_refused(
      "other_step",
      [](auto& j) {
        j["step"] = 4;
        j["run"]["step"] = 4;
        j["optimizer"]["steps"] = 4;
      },
      "step_00000001): is named for step 1 but holds the manifest of step 4");
}

TEST_CASE("hostile manifests are refused before they are parsed: nesting, size, a FIFO, links") {
  SUBCASE("a value in run nested a million arrays deep (copying it overflowed the stack)") {
    const std::string d = copy_of_valid("nested");
    std::string text = read_manifest(d).dump();
    const std::string deep = std::string(1000000, '[') + std::string(1000000, ']');
    text.insert(text.find("\"run\":{") + 7, cat("\"deep\": ", deep, ", "));
    write_text(step_dir(d) + "/manifest.json", text);
    refused(d, "nests JSON arrays and objects 33 or more deep, over the limit of 32");
    fs::remove_all(d);
  }
  SUBCASE("larger than the limit (a sparse file: nothing is read)") {
    const std::string d = copy_of_valid("huge");
    fs::resize_file(step_dir(d) + "/manifest.json", checkpoint::kMaxManifest + 1);
    refused(d, cat("is ", checkpoint::kMaxManifest + 1, " bytes, over the limit of ", checkpoint::kMaxManifest));
    fs::remove_all(d);
  }
  SUBCASE("a FIFO in place of the manifest (a read would wait for a writer forever)") {
    const std::string d = copy_of_valid("fifo");
    fs::remove(step_dir(d) + "/manifest.json");
    REQUIRE(::mkfifo((step_dir(d) + "/manifest.json").c_str(), 0644) == 0);
    refused(d, "manifest.json): is not a regular file");
    fs::remove_all(d);
  }
  SUBCASE("a listed file that is a link, to a valid copy outside the checkpoint") {
    const std::string d = copy_of_valid("link");
    const std::string outside = scratch("link_target");
    fs::rename(step_dir(d) + "/" + kRank1, outside);
    fs::create_symlink(outside, step_dir(d) + "/" + kRank1);
    refused(d, "rank_00001.safetensors): is a symbolic link");
    fs::remove_all(d);
    fs::remove(outside);
  }
  SUBCASE("a manifest that is a link, and a latest pointer that is one") {
    const std::string d = copy_of_valid("manifest_link");
    fs::rename(step_dir(d) + "/manifest.json", d + "/elsewhere.json");
    fs::create_symlink(d + "/elsewhere.json", step_dir(d) + "/manifest.json");
    refused(step_dir(d), "manifest.json): is a symbolic link");
    fs::remove(d + "/latest");
    fs::create_symlink(step_dir(d), d + "/latest");
    refused(d, "has a latest pointer that is not a regular file");
    fs::remove_all(d);
  }
  SUBCASE("100,000 files listed that do not exist: refused in time linear in the manifest") {
    const std::string d = copy_of_valid("many_files");
    auto j = read_manifest(d);
    for (int i = 0; i < 100000; ++i)
      j["files"].push_back({{"name", cat("extra_", i)}, {"bytes", 8}, {"xxh3", "0000000000000000"}});
    write_manifest(d, j);
    const auto t0 = std::chrono::steady_clock::now();
    refused(d, "extra_0): is missing");
    MESSAGE(cat("refused in ", std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), " s"));
    fs::remove_all(d);
  }
}

TEST_CASE("ranks that load different checkpoints are refused on every rank") {
  // Rank 1 passes another directory (as a rank started in another working directory resolves a
  // relative path): every rank refuses, naming both.
  const std::string a = copy_of_valid("rank_a"), b = copy_of_valid("rank_b");
  std::mutex mu;
  std::vector<std::string> messages;
  run_threads(2, [&](ThreadComm& world) {
    Host dev;
    Mesh mesh{world, {.data = 2}};
    gpt2::Model<float, false, recompute::None, Host> gpt(dev, ckpt_config(), mesh.spread(), 8);
    auto dp = optim::data_parallel<optim::Ddp>(gpt, optim::AdamW{}, mesh);
    std::string got;
    try {
      checkpoint::load(world.rank() == 0 ? a : b, gpt, dp, mesh);
    } catch (const Error& e) { got = e.what(); }
    std::lock_guard lock(mu);
    messages.push_back(got);
  });
  REQUIRE(messages.size() == 2);
  for (const std::string& m : messages) {
    CAPTURE(m);
    CHECK(m.find("world rank 1 differs from world rank 0 in checkpoint") != std::string::npos);
    CHECK(m.find(fs::weakly_canonical(b).string()) != std::string::npos);
  }
  fs::remove_all(a);
  fs::remove_all(b);
}
