// What saving and loading checkpoints share: the run state a trainer restores, the mesh they need,
// the step directories (names, the complete ones, resolving `latest`), dtype conversion, and the
// agreement of all ranks on a failure. checkpoint.hpp describes the whole.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <vector>

#include "weft/checkpoint/files.hpp"
#include "weft/checkpoint/manifest.hpp"
#include "weft/checkpoint/safetensors.hpp"
#include "weft/comm/redistribute.hpp"
#include "weft/core/bf16.hpp"
#include "weft/core/shape.hpp"

namespace weft::checkpoint {

// What a trainer restores besides the tensors. The RNG is counter-based (Philox keyed by the seed
// and the element's coordinates), so its state is the seed and the step.
struct RunState {
  std::int64_t step = 0;             // training steps done (the schedule's position)
  std::int64_t loader_position = 0;  // data::Loader::position()
  std::uint64_t seed = 0;
  nlohmann::json extra = nlohmann::json::object();  // the trainer's own (schedule, options)
};

// A mesh with a world communicator and coordinates (comm/mesh.hpp's Mesh).
template <class M>
concept CheckpointMesh = AxisComms<M> && requires(M& m) {
  m.world();
  m.coord();
  m.spread();
};

inline std::string step_name(std::int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "step_%08lld", static_cast<long long>(step));
  return buf;
}

// The complete checkpoints under root (a step directory with a manifest), oldest first.
inline std::vector<std::pair<std::int64_t, std::string>> complete_checkpoints(const std::string& root) {
  std::vector<std::pair<std::int64_t, std::string>> out;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(root, ec)) {
    const std::string n = e.path().filename().string();
    if (!e.is_directory() || !n.starts_with("step_") || n.size() != 13 || n.find_first_not_of("0123456789", 5) != std::string::npos) continue;
    if (std::filesystem::is_regular_file(e.path() / "manifest.json")) out.emplace_back(std::stoll(n.substr(5)), n);
  }
  std::sort(out.begin(), out.end());
  return out;
}

// The step directory a path names: the directory itself when it holds a manifest, else the target
// of its `latest` pointer.
inline std::string resolve(const std::string& path) {
  namespace fs = std::filesystem;
  const std::string where = cat("checkpoint(", path, ")");
  std::error_code ec;
  if (!fs::is_directory(path, ec)) throw Error(where, "is not a directory", "pass a checkpoint directory or the directory of a run's checkpoints");
  if (fs::is_regular_file(fs::path(path) / "manifest.json", ec)) return path;
  const fs::path latest = fs::path(path) / "latest";
  if (fs::is_regular_file(latest, ec)) {
    std::ifstream in(latest);
    std::string name;
    std::getline(in, name);
    if (!detail::plain_file_name(name) || !name.starts_with("step_"))
      throw Error(where, cat("its latest pointer holds \"", name.substr(0, 64), "\", not a step directory"), "remove it and resume from a step directory");
    const fs::path dir = fs::path(path) / name;
    if (!fs::is_regular_file(dir / "manifest.json", ec))
      throw Error(where, cat("latest names ", name, ", which has no manifest.json"), "resume from one of the complete step directories");
    return dir.string();
  }
  if (path.ends_with(".tmp") || path.ends_with(".tmp/"))
    throw Error(where, "is an unfinished save (a .tmp directory)", "resume from a complete step directory");
  throw Error(where, "has no manifest.json and no latest pointer: not a checkpoint, or a save that did not finish",
              "pass a step directory with a manifest.json, or the directory that holds latest");
}

namespace detail {

// Element i of a buffer of dtype `from`, as To (bf16 rounds once from f32).
template <class To>
To convert_element(DType from, const std::byte* p) {
  double v = 0;
  switch (from) {
    case DType::f64: std::memcpy(&v, p, 8); break;
    case DType::f32: {
      float f;
      std::memcpy(&f, p, 4);
      if constexpr (std::same_as<To, bf16>) return bf16(f);
      v = f;
      break;
    }
    case DType::bf16: {
      bf16 b;
      std::memcpy(&b, p, 2);
      if constexpr (std::same_as<To, bf16>) return b;
      v = static_cast<float>(b);
      break;
    }
    default: break;
  }
  if constexpr (std::same_as<To, bf16>) return bf16(static_cast<float>(v));
  else return static_cast<To>(v);
}

inline std::vector<std::int64_t> dims(const Shape& s) {
  std::vector<std::int64_t> v(static_cast<std::size_t>(s.rank()));
  for (int d = 0; d < s.rank(); ++d) v[static_cast<std::size_t>(d)] = s[d];
  return v;
}

// An Error on every rank when any rank failed: `mine` is this rank's message (empty: it did well).
template <class C>
void agree(C& world, const std::string& mine, const std::string& what) {
  std::array<std::int64_t, 1> failed{mine.empty() ? 0 : world.rank() + 1};
  world.all_reduce(std::span<std::int64_t>(failed), ReduceOp::max);
  if (!mine.empty()) throw Error("checkpoint", mine, "see the message; the previous checkpoint is unchanged");
  if (failed[0] != 0)
    throw Error("checkpoint", cat(what, " failed on rank ", failed[0] - 1), cat("see rank ", failed[0] - 1, "'s error"));
}

template <class F>
std::string attempt(F&& f) {
  try {
    f();
    return {};
  } catch (const std::exception& e) {
    return e.what();
  }
}

}  // namespace detail

}  // namespace weft::checkpoint
