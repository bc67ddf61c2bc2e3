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
#include "weft/comm/share.hpp"
#include "weft/core/bf16.hpp"
#include "weft/core/json_limits.hpp"
#include "weft/core/shape.hpp"

namespace weft::checkpoint {

// What a trainer restores besides the tensors. The RNG is counter-based (Philox keyed by the seed
// and the element's coordinates), so its state is the seed and the step.
struct RunState {
  std::int64_t step = 0;             // training steps done (the schedule's position)
  std::int64_t loader_position = 0;  // data::Loader::position()
  std::uint64_t seed = 0;
  nlohmann::json extra = nlohmann::json::object();  // the trainer's own (schedule, options)
  std::string family = {};  // the model family (train::Family's name; the manifest's "family"), or empty
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

// The complete checkpoints under root (a step directory, not a link, with a manifest), oldest first.
inline std::vector<std::pair<std::int64_t, std::string>> complete_checkpoints(const std::string& root) {
  std::vector<std::pair<std::int64_t, std::string>> out;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(root, ec)) {
    const std::string n = e.path().filename().string();
    if (!e.is_directory() || e.is_symlink() || !n.starts_with("step_") || n.size() != 13 ||
        n.find_first_not_of("0123456789", 5) != std::string::npos)
      continue;
    if (std::filesystem::is_regular_file(e.path() / "manifest.json")) out.emplace_back(std::stoll(n.substr(5)), n);
  }
  std::sort(out.begin(), out.end());
  return out;
}

// The step directory `latest` in root names ("" when there is none), read without following links.
inline std::string latest_of(const std::string& root) {
  namespace fs = std::filesystem;
  const fs::path latest = fs::path(root) / "latest";
  std::error_code ec;
  const auto st = fs::symlink_status(latest, ec);
  if (ec || !fs::is_regular_file(st)) return {};
  std::ifstream in(latest);
  std::string name(64, '\0');
  in.read(name.data(), static_cast<std::streamsize>(name.size()));
  name.resize(static_cast<std::size_t>(in.gcount()));
  if (const auto nl = name.find('\n'); nl != std::string::npos) name.resize(nl);
  return name;
}

// The step directory a path names: the directory itself when it holds a manifest, else the target
// of its `latest` pointer. Inside a checkpoint nothing is followed through a link: `latest` and the
// directory it names are a regular file and a directory of root.
inline std::string resolve(const std::string& path) {
  namespace fs = std::filesystem;
  const std::string where = cat("checkpoint(", path, ")");
  std::error_code ec;
  if (!fs::is_directory(path, ec))
    throw Error(where, "is not a directory", "pass a checkpoint directory or the directory of a run's checkpoints");
  if (fs::exists(fs::symlink_status(fs::path(path) / "manifest.json", ec))) return path;
  const fs::path latest = fs::path(path) / "latest";
  if (const auto st = fs::symlink_status(latest, ec); fs::exists(st)) {
    if (!fs::is_regular_file(st))
      throw Error(where, "has a latest pointer that is not a regular file (a link, or a directory)",
                  "remove it and resume from a step directory");
    const std::string name = latest_of(path);
    if (!detail::plain_file_name(name) || !name.starts_with("step_"))
      throw Error(where, cat("its latest pointer holds \"", brief(name), "\", not a step directory"),
                  "remove it and resume from a step directory");
    const fs::path dir = fs::path(path) / name;
    if (fs::is_symlink(fs::symlink_status(dir, ec)))
      throw Error(where, cat("latest names ", name, ", which is a symbolic link"),
                  "weft saves step directories as directories; resume from one of them");
    if (!fs::exists(fs::symlink_status(dir / "manifest.json", ec)))  // what it is, read_manifest_text checks
      throw Error(where, cat("latest names ", name, ", which has no manifest.json"),
                  "resume from one of the complete step directories");
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
    case DType::i32: {
      std::int32_t i;
      std::memcpy(&i, p, 4);
      v = static_cast<double>(i);
      break;
    }
    case DType::i64: {  // exact below 2^53 (labels, steps, token ids)
      std::int64_t i;
      std::memcpy(&i, p, 8);
      v = static_cast<double>(i);
      break;
    }
    default:
      throw Error("checkpoint", cat("a tensor of dtype ", name(from), " to convert"),
                  "store F64, F32, BF16, I32 or I64");
  }
  if constexpr (std::same_as<To, bf16>) return bf16(static_cast<float>(v));
  else return static_cast<To>(v);
}

inline std::vector<std::int64_t> dims(const Shape& s) {
  std::vector<std::int64_t> v(static_cast<std::size_t>(s.rank()));
  for (int d = 0; d < s.rank(); ++d) v[static_cast<std::size_t>(d)] = s[d];
  return v;
}

// An Error on every rank when any rank failed, the same on each: the lowest failing rank's message
// (`mine`: this rank's, empty when it did well), so the cause is printed whichever rank reports it.
// `what` names the step ("writing a checkpoint file"), `fix` what the caller can do.
template <class C>
void agree(C& world, const std::string& mine, const std::string& what, const std::string& fix) {
  const int n = world.size();
  std::array<std::int64_t, 1> failed{mine.empty() ? 0 : n - world.rank()};
  world.all_reduce(std::span<std::int64_t>(failed), ReduceOp::max);
  if (failed[0] == 0) return;
  const int who = n - static_cast<int>(failed[0]);
  const std::string cause = share_text(world, world.rank() == who ? mine : std::string(), who);
  throw Error("checkpoint", cat(what, " failed on world rank ", who, ": ", cause), fix);
}

// What a failed save leaves, and what a failed load does.
inline constexpr const char* kSaveUnchanged = "the previous checkpoint is unchanged";
inline constexpr const char* kLoadFailed = "nothing usable was loaded: load a complete checkpoint of this model";

template <class F>
std::string attempt(F&& f) {
  try {
    f();
    return {};
  } catch (const std::exception& e) { return e.what(); }
}

}  // namespace detail

}  // namespace weft::checkpoint
