// Corrupt checkpoints: each of 30 handcrafted faults in a valid checkpoint (its files, its manifest,
// its latest pointer, the model it is loaded into) is refused with its own message, naming the file
// or the tensor and the expected against the actual value. Nothing is loaded from a checkpoint that
// fails a check (load() verifies everything before it writes into the model).
#include <doctest/doctest.h>

#include <fstream>

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
void write_manifest(const std::string& root, const nlohmann::json& j) { std::ofstream(step_dir(root) + "/manifest.json") << j.dump(1); }
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
  } catch (const Error& e) {
    got = e.what();
  }
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
  CHECK(r.manifest().files.size() == 4);
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
  manifest_refused("mesh", [](auto& j) { j["mesh"]["tensor"] = 0; }, "each must be >= 1");
  manifest_refused("policy", [](auto& j) { j["policy"] = "scattered"; }, "has policy \"scattered\"");
  manifest_refused("xxh3", [](auto& j) { j["files"][0]["xxh3"] = "xyz"; }, "has a malformed xxh3 \"xyz\"");
  manifest_refused("traversal", [](auto& j) { j["files"][0]["name"] = "../rank_00000.safetensors"; }, "outside its directory");
  manifest_refused("file_twice", [](auto& j) { j["files"].push_back(j["files"][0]); }, "lists the file rank_00000.safetensors twice");
  manifest_refused("dtype", [](auto& j) { j["tensors"]["param/wpe"]["dtype"] = "F8"; }, "tensor param/wpe has dtype \"F8\"");
  manifest_refused("rank0", [](auto& j) { j["tensors"]["param/wpe"]["global"] = nlohmann::json::array(); },
                   "tensor param/wpe has a global shape [] of no, too many or too large dims");
  manifest_refused("overflow", [](auto& j) { j["tensors"]["param/wpe"]["global"] = {std::int64_t{1} << 40, std::int64_t{1} << 40}; },
                   "of no, too many or too large dims");
  manifest_refused("logical", [](auto& j) { j["tensors"]["param/wte"]["logical"] = {40, 32}; }, "has a logical shape [40,32] outside its global shape");
  manifest_refused("box", [](auto& j) { j["tensors"]["param/wte"]["pieces"][0]["box_offset"] = {31, 0}; }, "leaves the global shape");
  manifest_refused("range", [](auto& j) { j["tensors"]["param/wpe"]["pieces"][0]["count"] = 100000; }, "outside its box of");
  manifest_refused("unlisted", [](auto& j) { j["tensors"]["param/wpe"]["pieces"][0]["file"] = "rank_00009.safetensors"; },
                   "which is not among the files");
  manifest_refused("missing_piece", [](auto& j) { j["tensors"]["param/wte"]["pieces"].erase(0); }, "tensor param/wte: elements [");
  manifest_refused("missing_piece", [](auto& j) { j["tensors"]["param/wte"]["pieces"].erase(0); }, "are in no piece");
  manifest_refused("twice", [](auto& j) { j["tensors"]["param/wpe"]["pieces"].push_back(j["tensors"]["param/wpe"]["pieces"][0]); },
                   "are held by two pieces");
  manifest_refused("no_tensor", [](auto& j) { j["tensors"].erase("param/wpe"); }, "has no tensor param/wpe", "param/wpe");
  manifest_refused("key", [](auto& j) { j["tensors"]["param/wpe"]["pieces"][0]["key"] = "param/elsewhere"; },
                   "has no tensor param/elsewhere, which the manifest places there for param/wpe", "param/wpe");
  const auto first = read_manifest(valid())["tensors"]["param/wpe"]["pieces"][0];
  const std::int64_t n = first["count"].get<std::int64_t>();
  manifest_refused("dtype_mismatch", [](auto& j) { j["tensors"]["param/wpe"]["dtype"] = "BF16"; },
                   cat(first["file"].get<std::string>(), "): holds param/wpe as F32 of ", n, " elements; the manifest expects BF16 of ", n),
                   "param/wpe");
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

TEST_CASE("a checkpoint of other sizes is refused when loaded into a model") {
  const std::string d = copy_of_valid("other_sizes");
  nn::GptConfig c = ckpt_config();
  c.width = 64;
  std::string got;
  try {
    ckpt_run<float, optim::Zero1>({.data = 2, .tensor = 2}, RunPlan::resumed(d, "", 2), c);
  } catch (const Error& e) {
    got = e.what();
  }
  CAPTURE(got);
  CHECK(got.find("tensor param/wte has the shape 30x32; this model's is 30x64") != std::string::npos);
  fs::remove_all(d);
}
