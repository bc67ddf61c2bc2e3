// libFuzzer target: a whole checkpoint opened with the input as its manifest. At start-up it writes
// a small valid checkpoint (two rank files of pieces, as weft's saves write them) into a temporary
// directory; each input replaces the manifest there and Reader opens it: the manifest parsed, every
// file verified (size, hash, its piece records against the manifest's), coverage checked, then
// every tensor read. The valid manifest is written into $WEFT_FUZZ_SEED_DIR when set (run.sh sets
// it to the work corpus), so mutations start from a checkpoint that opens. Every input opens or is
// refused with a weft::Error; anything else (a crash, a sanitizer report, a hang) is a bug.
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "weft/checkpoint/pieces.hpp"
#include "weft/checkpoint/verify.hpp"

namespace {

namespace ck = weft::checkpoint;

std::string g_dir;

// Two ranks' files: a (4, 3) tensor split by rows over them, a (5) tensor on rank 0, and their
// f32 pieces' bytes.
ck::Manifest write_valid(const std::string& dir) {
  auto piece = [](std::string tensor, std::vector<std::int64_t> global, std::vector<std::int64_t> offset,
                  std::vector<std::int64_t> extent, std::int64_t first, std::int64_t count) {
    ck::detail::Staged s{std::move(tensor),
                         weft::DType::f32,
                         global,
                         global,
                         std::move(offset),
                         std::move(extent),
                         "Layout<...>",
                         first,
                         count,
                         std::vector<std::byte>(static_cast<std::size_t>(count) * 4)};
    for (std::size_t i = 0; i < s.bytes.size(); ++i) s.bytes[i] = static_cast<std::byte>(i * 7 + 1);
    return s;
  };
  ck::Manifest m;
  m.policy = "sharded";
  m.step = 3;
  m.data = 2;
  m.model = {{"width", 3}};
  m.optimizer = {{"rule", "adamw"}, {"steps", 3}, {"skipped", 0}};
  m.run = {{"step", 3}, {"loader_position", 3}, {"seed", 1}};
  m.strategy = "DataLayout<...>";
  m.precision = "f32";
  const std::vector<std::vector<ck::detail::Staged>> ranks{
      {piece("param/w", {4, 3}, {0, 0}, {4, 3}, 0, 6), piece("param/b", {5}, {0}, {5}, 0, 5)},
      {piece("param/w", {4, 3}, {0, 0}, {4, 3}, 6, 6)}};
  for (std::size_t r = 0; r < ranks.size(); ++r) {
    const std::string file = "rank_0000" + std::to_string(r) + ".safetensors";
    m.add_file({file, ck::detail::write_staged(dir + "/" + file, ranks[r])});
    ck::add_pieces(m, dir, file);
  }
  return m;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  g_dir = (std::filesystem::temp_directory_path() / ("weft_fuzz_checkpoint_" + std::to_string(::getpid()))).string();
  std::filesystem::remove_all(g_dir);
  std::filesystem::create_directories(g_dir);
  const std::string text = ck::to_json(write_valid(g_dir)).dump(1);
  std::ofstream(g_dir + "/manifest.json", std::ios::trunc) << text;
  (void)ck::Reader(g_dir).read<float>("param/w");  // the valid checkpoint opens (else the target is broken)
  if (const char* seeds = std::getenv("WEFT_FUZZ_SEED_DIR"))
    std::ofstream(std::string(seeds) + "/valid_manifest.json") << text;
  std::atexit([] { std::filesystem::remove_all(g_dir); });
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  {
    std::ofstream out(g_dir + "/manifest.json", std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  }
  try {
    const ck::Reader r(g_dir);
    for (const auto& [name, t] : r.manifest().tensors) (void)r.read<double>(name);
  } catch (const weft::Error&) {}
  return 0;
}
