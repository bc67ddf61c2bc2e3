// Checkpoints: a model's parameters and its data-parallel optimizer state, saved as they lie on the
// ranks and loaded into any other mesh, strategy and precision.
//
//   checkpoint::save<Sharded>(root, model, dp, mesh, state, {.keep = 3});   every rank calls it
//   auto state = checkpoint::load(root, model, dp, mesh);                   root: latest, or a step
//
// What a rank saves. Each unit's flat buffer (nn/unit.hpp) is cut into data-parallel slices, one
// per data rank, whatever the strategy: data rank d saves elements [d S, (d + 1) S) of every unit
// it holds (S = padded / dp), which it holds under DDP, ZeRO and FSDP alike. A slice meets each
// parameter's entry in a contiguous range of the entry's tensor-parallel shard, which is a box of
// the global tensor (UnitEntry::box_offset, local): that (box, range) is one piece. Tensor-
// replicated parameters are saved by tensor rank 0 only, the tied table's copy on the last pipeline
// rank not at all: every global element is saved exactly once (check_coverage verifies it).
//
// Policies (a type, as the other policies are):
//   Sharded       every rank writes rank_<r>.safetensors with its pieces; nothing is gathered.
//   Consolidated  every rank sends its pieces to world rank 0, which writes model.safetensors with
//                 each tensor whole (its global shape); the manifest lists one piece per tensor.
// Both load the same way.
//
// A save, made durable step by step (files.hpp):
//   1. rank 0 creates <root>/step_<N>.tmp/; every rank copies its pieces to host memory (the only
//      part that waits for the device) and writes its file there, fsynced;
//   2. the ranks exchange their files' sizes and XXH3 hashes;
//   3. rank 0 fsyncs the directory, renames it to step_<N>, writes manifest.json into it (a
//      temporary name, fsync, rename), then moves <root>/latest to it, then removes the oldest
//      checkpoints beyond `keep`.
// A save cut at any point leaves `latest` on the previous complete checkpoint; a directory without
// a manifest is refused by load(). A failure on any rank becomes an Error on every rank.
//
// A load:
//   1. finds the checkpoint (<root>/latest, or a step directory), parses and validates the manifest
//      (manifest.hpp), checks that every tensor is covered exactly once;
//   2. verifies every file's size and hash, the files divided among the ranks, the results shared:
//      every rank throws the same Error naming the file, expected against actual;
//   3. fills what this rank holds (Holding: values, master weights, optimizer state) from the byte
//      ranges of the pieces that overlap it, converting dtypes where the precision changed:
//      values and master weights come from the saved master weights where there are any (mixed
//      precision), else from the saved values; so bf16 -> f32 continues from the f32 masters, and
//      f32 -> bf16 rounds once. Padding (rows of wte past the vocabulary, units' tail) is left as
//      the model initialized it: no result reads it.
#pragma once

#include <algorithm>
#include <array>
#include <bit>
#include <condition_variable>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "weft/checkpoint/files.hpp"
#include "weft/checkpoint/manifest.hpp"
#include "weft/checkpoint/safetensors.hpp"
#include "weft/comm/redistribute.hpp"
#include "weft/core/bf16.hpp"
#include "weft/core/precision.hpp"
#include "weft/nn/unit.hpp"

namespace weft::checkpoint {

// Saving policies.
struct Sharded {
  static constexpr const char* name = "sharded";
};
struct Consolidated {
  static constexpr const char* name = "consolidated";
};
template <class P>
concept SavePolicy = std::same_as<P, Sharded> || std::same_as<P, Consolidated>;

// What a trainer restores besides the tensors. The RNG is counter-based (Philox keyed by the seed
// and the element's coordinates), so its state is the seed and the step.
struct RunState {
  std::int64_t step = 0;             // training steps done (the schedule's position)
  std::int64_t loader_position = 0;  // data::Loader::position()
  std::uint64_t seed = 0;
  nlohmann::json extra = nlohmann::json::object();  // the trainer's own (schedule, options)
};

struct SaveOptions {
  int keep = 0;  // keep the newest `keep` checkpoints (0: all)
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

template <class T>
constexpr const char* kind_dtype_name() {
  return safetensors_dtype(dtype_of<T>);
}

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

// One piece this rank saves: host bytes and where they lie.
struct Staged {
  std::string tensor;  // "param/wte"
  DType dtype = DType::f32;
  std::vector<std::int64_t> global, logical, box_offset, box_extent;
  std::string layout;
  std::int64_t first = 0, count = 0;
  std::vector<std::byte> bytes;
};

inline std::vector<std::int64_t> dims(const Shape& s) {
  std::vector<std::int64_t> v(static_cast<std::size_t>(s.rank()));
  for (int d = 0; d < s.rank(); ++d) v[static_cast<std::size_t>(d)] = s[d];
  return v;
}

// Copies this rank's pieces to host memory (waits for the device's queued work).
template <class Model, class DP, class M>
std::vector<Staged> stage(Model& model, DP& dp, M& mesh) {
  using T = typename Model::value_type;
  using G = master_t<T>;
  auto& dev = model.dev();
  dev.synchronize();
  std::vector<Staged> out;
  const int tensor_index = mesh.coord().tensor;
  std::optional<std::size_t> skip;
  if constexpr (requires { model.tied_unit(); })
    if (model.tied_unit() && model.tied_copy()) skip = model.tied_unit();
  auto units = model.units();
  for (std::size_t u = 0; u < units.size(); ++u) {
    if (skip && *skip == u) continue;
    const auto h = dp.holding(u);
    const auto [slo, sn] = dp.data_slice(u);
    for (const nn::UnitEntry& e : units[u].entries()) {
      const std::int64_t a = std::max(slo, e.offset), b = std::min(slo + sn, e.offset + e.numel);
      if (a >= b || (!e.tensor_sharded && tensor_index != 0)) continue;
      auto add = [&]<class X>(const std::string& kind, const X* src) {
        Staged s{cat(kind, "/", e.name), dtype_of<X>, dims(e.global), dims(e.logical), dims(e.box_offset), dims(e.local), e.layout,
                 a - e.offset, b - a, std::vector<std::byte>(static_cast<std::size_t>(b - a) * sizeof(X))};
        dev.to_host(s.bytes.data(), src, s.bytes.size());
        out.push_back(std::move(s));
      };
      add.template operator()<T>("param", h.values + (a - h.values_lo));
      if (h.master) add.template operator()<G>("master", h.master + (a - h.lo));
      for (int k = 0; k < static_cast<int>(h.state.size()); ++k)
        add.template operator()<typename std::remove_pointer_t<std::remove_cvref_t<decltype(h.state[0])>>>(
            DP::rule_type::state_names[static_cast<std::size_t>(k)], h.state[static_cast<std::size_t>(k)] + (a - h.lo));
    }
  }
  return out;
}

inline std::string rank_file(int rank) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "rank_%05d.safetensors", rank);
  return buf;
}

// Writes staged pieces as one file; the pieces' layout goes in its metadata ("weft.pieces").
inline Digest write_staged(const std::string& path, const std::vector<Staged>& staged) {
  std::vector<TensorData> tensors;
  nlohmann::json meta = nlohmann::json::array();
  for (const Staged& s : staged) {
    tensors.push_back({s.tensor, s.dtype, {s.count}, s.bytes.data()});
    meta.push_back({{"tensor", s.tensor}, {"global", s.global}, {"logical", s.logical}, {"layout", s.layout},
                    {"box_offset", s.box_offset}, {"box_extent", s.box_extent}, {"first", s.first}, {"count", s.count}});
  }
  return write(path, tensors, {{"weft.pieces", meta.dump()}});
}

// The tensors of a manifest from the pieces' records in each file's metadata.
inline void add_pieces(Manifest& m, const std::string& dir, const std::string& file) {
  const Header h = read_header(cat(dir, "/", file));
  const auto it = h.metadata.find("weft.pieces");
  if (it == h.metadata.end()) throw Error(cat("checkpoint(", dir, "/", file, ")"), "has no weft.pieces metadata", "save again");
  for (const auto& p : nlohmann::json::parse(it->second)) {
    const std::string name = p.at("tensor").get<std::string>();
    const TensorInfo* info = h.find(name);
    if (!info) throw Error(cat("checkpoint(", dir, "/", file, ")"), cat("lists a piece ", name, " it does not hold"), "save again");
    TensorRecord& t = m.tensors[name];
    t.dtype = info->dtype;
    t.global = p.at("global").get<std::vector<std::int64_t>>();
    t.logical = p.at("logical").get<std::vector<std::int64_t>>();
    t.layout = p.at("layout").get<std::string>();
    t.pieces.push_back({file, name, p.at("box_offset").get<std::vector<std::int64_t>>(), p.at("box_extent").get<std::vector<std::int64_t>>(),
                        p.at("first").get<std::int64_t>(), p.at("count").get<std::int64_t>()});
  }
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

// Rank 0's part of finishing a save: rename, manifest, latest, pruning.
inline void publish(const std::string& root, Manifest m, const std::vector<Digest>& digests, bool sharded, int keep) {
  namespace fs = std::filesystem;
  const std::string name = step_name(m.step), tmp = cat(root, "/", name, ".tmp"), dir = cat(root, "/", name);
  if (sharded) {
    for (std::size_t r = 0; r < digests.size(); ++r) {
      m.files.push_back({rank_file(static_cast<int>(r)), digests[r]});
      add_pieces(m, tmp, rank_file(static_cast<int>(r)));
    }
  } else {
    m.files.push_back({"model.safetensors", digests[0]});
    add_pieces(m, tmp, "model.safetensors");
  }
  check_coverage(m, tmp);
  point("directory fsync");
  sync_directory(tmp);
  point("directory rename");
  if (std::rename(tmp.c_str(), dir.c_str()) != 0) detail::sys_fail(cat("checkpoint(", dir, ")"), cat("cannot rename ", tmp), errno);
  sync_directory(root);
  point("manifest");
  write_atomic(cat(dir, "/manifest.json"), to_json(m).dump(1));
  point("latest");
  write_atomic(cat(root, "/latest"), name + "\n");
  if (keep > 0) {
    auto all = complete_checkpoints(root);
    for (std::size_t i = 0; i + static_cast<std::size_t>(keep) < all.size(); ++i) {
      point("prune");
      fs::remove_all(fs::path(root) / all[i].second);
    }
    sync_directory(root);
  }
}

// Before a save of step N: a stale step_N.tmp goes; an existing step_N is replaced, and if latest
// names it, latest first moves back to the newest other complete checkpoint (or goes).
inline void prepare(const std::string& root, std::int64_t step) {
  namespace fs = std::filesystem;
  fs::create_directories(root);
  const std::string name = step_name(step);
  fs::remove_all(fs::path(root) / (name + ".tmp"));
  if (fs::exists(fs::path(root) / name)) {
    std::string latest;
    if (std::ifstream in(fs::path(root) / "latest"); in) std::getline(in, latest);
    if (latest == name) {
      std::string other;
      for (const auto& [s, n] : complete_checkpoints(root))
        if (n != name) other = n;
      if (other.empty()) fs::remove(fs::path(root) / "latest");
      else write_atomic(cat(root, "/latest"), other + "\n");
    }
    fs::remove_all(fs::path(root) / name);
  }
  point("tmp directory");
  fs::create_directories(fs::path(root) / (name + ".tmp"));
  sync_directory(root);
}

// The bytes of staged pieces in one i64 message (for the consolidated policy's sends), and back.
inline std::vector<std::int64_t> pack(const std::vector<Staged>& staged) {
  nlohmann::json meta = nlohmann::json::array();
  std::size_t data = 0;
  for (const Staged& s : staged) {
    meta.push_back({{"tensor", s.tensor}, {"dtype", safetensors_dtype(s.dtype)}, {"global", s.global}, {"logical", s.logical},
                    {"layout", s.layout}, {"box_offset", s.box_offset}, {"box_extent", s.box_extent}, {"first", s.first}, {"count", s.count}});
    data += s.bytes.size();
  }
  const std::string text = meta.dump();
  std::vector<std::byte> bytes(8 + text.size() + data);
  const std::uint64_t n = text.size();
  std::memcpy(bytes.data(), &n, 8);
  std::memcpy(bytes.data() + 8, text.data(), text.size());
  std::size_t at = 8 + text.size();
  for (const Staged& s : staged) {
    if (!s.bytes.empty()) std::memcpy(bytes.data() + at, s.bytes.data(), s.bytes.size());
    at += s.bytes.size();
  }
  std::vector<std::int64_t> words((bytes.size() + 7) / 8 + 1);
  words[0] = static_cast<std::int64_t>(bytes.size());
  std::memcpy(words.data() + 1, bytes.data(), bytes.size());
  return words;
}

inline std::vector<Staged> unpack(const std::vector<std::int64_t>& words) {
  const auto* bytes = reinterpret_cast<const std::byte*>(words.data() + 1);
  std::uint64_t n = 0;
  std::memcpy(&n, bytes, 8);
  const auto meta = nlohmann::json::parse(std::string(reinterpret_cast<const char*>(bytes) + 8, n));
  std::size_t at = 8 + n;
  std::vector<Staged> out;
  for (const auto& p : meta) {
    Staged s;
    s.tensor = p.at("tensor").get<std::string>();
    const std::string dt = p.at("dtype").get<std::string>();
    s.dtype = dt == "F64" ? DType::f64 : dt == "BF16" ? DType::bf16 : DType::f32;
    s.global = p.at("global").get<std::vector<std::int64_t>>();
    s.logical = p.at("logical").get<std::vector<std::int64_t>>();
    s.layout = p.at("layout").get<std::string>();
    s.box_offset = p.at("box_offset").get<std::vector<std::int64_t>>();
    s.box_extent = p.at("box_extent").get<std::vector<std::int64_t>>();
    s.first = p.at("first").get<std::int64_t>();
    s.count = p.at("count").get<std::int64_t>();
    const std::size_t len = static_cast<std::size_t>(s.count) * size_of(s.dtype);
    s.bytes.assign(bytes + at, bytes + at + len);
    at += len;
    out.push_back(std::move(s));
  }
  return out;
}

// Rank 0 of the consolidated policy: every rank's pieces placed into whole global tensors.
inline std::vector<Staged> consolidate(const std::vector<std::vector<Staged>>& all) {
  std::map<std::string, Staged> whole;
  for (const auto& rank : all)
    for (const Staged& s : rank) {
      auto [it, fresh] = whole.try_emplace(s.tensor);
      Staged& w = it->second;
      std::int64_t numel = 0;
      detail::product(s.global, numel);
      const std::size_t es = size_of(s.dtype);
      if (fresh) {
        w = Staged{s.tensor, s.dtype, s.global, s.logical, std::vector<std::int64_t>(s.global.size(), 0), s.global, s.layout, 0, numel,
                   std::vector<std::byte>(static_cast<std::size_t>(numel) * es)};
      }
      std::int64_t src = 0;
      for_each_run(s.global, s.box_offset, s.box_extent, s.first, s.count, [&](std::int64_t b, std::int64_t e) {
        std::memcpy(w.bytes.data() + static_cast<std::size_t>(b) * es, s.bytes.data() + static_cast<std::size_t>(src) * es,
                    static_cast<std::size_t>(e - b) * es);
        src += e - b;
      });
    }
  std::vector<Staged> out;
  for (auto& [n, s] : whole) out.push_back(std::move(s));
  return out;
}

template <class Model, class DP>
nlohmann::json model_json(Model& model) {
  nlohmann::json j = nlohmann::json::object();
  if constexpr (requires { model.config.vocab; }) {
    const auto& c = model.config;
    j = {{"vocab", c.vocab}, {"seq", c.seq}, {"layers", c.layers}, {"heads", c.heads}, {"width", c.width}};
  }
  return j;
}

}  // namespace detail

// Asynchronous saves: save() copies this rank's pieces to host memory and returns while a thread
// writes the file; the save is published (hashes exchanged, manifest, latest) by the first poll()
// that finds every rank's file written, or by wait(). A second save() waits for the first. All
// ranks call save(), poll() and wait() at the same points (they are collective).
template <SavePolicy Policy = Sharded>
class Saver {
 public:
  explicit Saver(std::string root, SaveOptions opt = {}, bool async = false) : root_(std::move(root)), opt_(opt), async_(async) {}
  Saver(const Saver&) = delete;
  Saver& operator=(const Saver&) = delete;
  ~Saver() {
    if (writer_.joinable()) writer_.join();
  }

  const std::string& root() const { return root_; }
  bool pending() const { return pending_; }

  template <class Model, class DP, CheckpointMesh M>
  void save(Model& model, DP& dp, M& mesh, const RunState& state) {
    auto& world = mesh.world();
    wait(mesh);
    std::string err = world.rank() == 0 ? detail::attempt([&] { detail::prepare(root_, state.step); }) : std::string();
    detail::agree(world, err, "preparing the checkpoint directory");
    std::vector<detail::Staged> staged;
    err = detail::attempt([&] { staged = detail::stage(model, dp, mesh); });
    detail::agree(world, err, "copying the state to host memory");

    manifest_ = Manifest{};
    manifest_.policy = Policy::name;
    manifest_.step = state.step;
    manifest_.data = mesh.comm(Axis::data).size();
    manifest_.tensor = mesh.comm(Axis::tensor).size();
    manifest_.pipe = mesh.comm(Axis::pipe).size();
    manifest_.strategy = DP::name();
    manifest_.precision = precision_t<typename Model::value_type>::name();
    manifest_.model = detail::model_json<Model, DP>(model);
    manifest_.optimizer = {{"rule", DP::rule_type::name}, {"steps", dp.steps()}, {"skipped", dp.skipped()}};
    manifest_.run = {{"step", state.step}, {"loader_position", state.loader_position}, {"seed", state.seed}, {"extra", state.extra}};

    const std::string dir = cat(root_, "/", step_name(state.step), ".tmp");
    if constexpr (std::same_as<Policy, Consolidated>) {
      // Every rank's pieces to world rank 0, in rank order.
      auto words = detail::pack(staged);
      std::vector<std::vector<detail::Staged>> all;
      if (world.rank() == 0) {
        all.push_back(std::move(staged));
        for (int r = 1; r < world.size(); ++r) {
          std::array<std::int64_t, 1> n{};
          world.recv(std::span<std::int64_t>(n), r);
          std::vector<std::int64_t> in(static_cast<std::size_t>(n[0]));
          world.recv(std::span<std::int64_t>(in), r);
          all.push_back(detail::unpack(in));
        }
        staged = detail::consolidate(all);
      } else {
        const std::array<std::int64_t, 1> n{static_cast<std::int64_t>(words.size())};
        world.send(std::span<const std::int64_t>(n), 0);
        world.send(std::span<const std::int64_t>(words), 0);
        staged.clear();
      }
    }
    const bool writes = std::same_as<Policy, Sharded> || world.rank() == 0;
    const std::string file = std::same_as<Policy, Sharded> ? detail::rank_file(world.rank()) : "model.safetensors";
    auto job = [this, staged = std::move(staged), path = cat(dir, "/", file), writes]() {
      std::string e;
      Digest d;
      if (writes) e = detail::attempt([&] { d = detail::write_staged(path, staged); });
      std::lock_guard lock(mu_);
      digest_ = d;
      error_ = e;
      done_ = true;
    };
    pending_ = true;
    done_ = false;
    if (async_) writer_ = std::thread(std::move(job));
    else job();
    if (!async_) wait(mesh);
  }

  // Publishes a pending save if every rank has written its file. Returns whether none is pending.
  template <CheckpointMesh M>
  bool poll(M& mesh) {
    if (!pending_) return true;
    std::array<std::int64_t, 1> waiting{done() ? 0 : 1};
    mesh.world().all_reduce(std::span<std::int64_t>(waiting), ReduceOp::max);
    if (waiting[0] != 0) return false;
    finish(mesh);
    return true;
  }

  // Waits for a pending save and publishes it.
  template <CheckpointMesh M>
  void wait(M& mesh) {
    if (!pending_) return;
    if (writer_.joinable()) writer_.join();
    finish(mesh);
  }

 private:
  bool done() {
    std::lock_guard lock(mu_);
    return done_;
  }

  template <CheckpointMesh M>
  void finish(M& mesh) {
    auto& world = mesh.world();
    if (writer_.joinable()) writer_.join();
    pending_ = false;
    detail::agree(world, error_, "writing a checkpoint file");
    std::array<std::int64_t, 2> mine{static_cast<std::int64_t>(digest_.bytes), std::bit_cast<std::int64_t>(digest_.xxh3)};
    std::vector<std::int64_t> all(2 * static_cast<std::size_t>(world.size()));
    world.all_gather(std::span<const std::int64_t>(mine), std::span<std::int64_t>(all));
    std::string err;
    if (world.rank() == 0) {
      std::vector<Digest> digests;
      const int files = std::same_as<Policy, Sharded> ? world.size() : 1;
      for (int r = 0; r < files; ++r)
        digests.push_back({static_cast<std::uint64_t>(all[2 * static_cast<std::size_t>(r)]),
                           std::bit_cast<std::uint64_t>(all[2 * static_cast<std::size_t>(r) + 1])});
      err = detail::attempt([&] { detail::publish(root_, manifest_, digests, std::same_as<Policy, Sharded>, opt_.keep); });
    }
    detail::agree(world, err, "publishing the checkpoint");
  }

  std::string root_;
  SaveOptions opt_;
  bool async_;
  bool pending_ = false;
  Manifest manifest_;
  std::thread writer_;
  std::mutex mu_;
  bool done_ = false;
  Digest digest_;
  std::string error_;
};

// A synchronous save (every rank calls it).
template <SavePolicy Policy = Sharded, class Model, class DP, CheckpointMesh M>
void save(const std::string& root, Model& model, DP& dp, M& mesh, const RunState& state, SaveOptions opt = {}) {
  Saver<Policy> s(root, opt);
  s.save(model, dp, mesh, state);
}

namespace detail {

// Verifies every file's size and hash, the files divided among the ranks; the same Error on every
// rank for the first bad file.
template <class C>
void verify_files(const Manifest& m, const std::string& dir, C& world) {
  const std::size_t n = m.files.size();
  std::vector<std::int64_t> status(3 * n, 0);  // per file: 1 + kind of failure, actual bytes, actual hash
  std::vector<std::string> messages(n);
  for (std::size_t i = 0; i < n; ++i) {
    if (static_cast<int>(i % static_cast<std::size_t>(world.size())) != world.rank()) continue;
    const std::string path = cat(dir, "/", m.files[i].name);
    std::error_code ec;
    if (!std::filesystem::is_regular_file(path, ec)) {
      status[3 * i] = 1;
      continue;
    }
    const Digest d = digest_file(path);
    if (d.bytes != m.files[i].digest.bytes) status[3 * i] = 2;
    else if (d.xxh3 != m.files[i].digest.xxh3) status[3 * i] = 3;
    status[3 * i + 1] = static_cast<std::int64_t>(d.bytes);
    status[3 * i + 2] = std::bit_cast<std::int64_t>(d.xxh3);
  }
  world.all_reduce(std::span<std::int64_t>(status), ReduceOp::sum);  // one rank wrote each file's entries
  for (std::size_t i = 0; i < n; ++i) {
    const FileRecord& f = m.files[i];
    const std::string where = cat("checkpoint(", dir, "/", f.name, ")");
    switch (status[3 * i]) {
      case 1: throw Error(where, "is missing", "the checkpoint is incomplete; resume from another one");
      case 2:
        throw Error(where, cat("has ", status[3 * i + 1], " bytes; the manifest expects ", f.digest.bytes),
                    "the file was truncated or replaced; resume from another checkpoint");
      case 3:
        throw Error(where, cat("has xxh3 ", hex64(std::bit_cast<std::uint64_t>(status[3 * i + 2])), "; the manifest expects ", hex64(f.digest.xxh3)),
                    "the file is corrupt; resume from another checkpoint");
      default: break;
    }
  }
}

// Reads pieces' byte ranges, each file opened once with its header validated.
class Sources {
 public:
  Sources(const Manifest& m, std::string dir) : m_(&m), dir_(std::move(dir)) {}

  // Copies elements [first, first + count) of tensor t's pieces' stored order... see fill().
  struct Open {
    std::unique_ptr<detail::Fd> fd;
    Header header;
  };
  Open& open(const std::string& file) {
    auto it = files_.find(file);
    if (it != files_.end()) return it->second;
    const std::string path = cat(dir_, "/", file);
    Open o{nullptr, read_header(path)};
    o.fd = std::make_unique<detail::Fd>(path, O_RDONLY);
    return files_.emplace(file, std::move(o)).first->second;
  }
  // The byte offset in `file` of element i of piece p of tensor `name` (checked against the header).
  std::uint64_t locate(const std::string& name, const TensorRecord& t, const PieceRecord& p) {
    Open& o = open(p.file);
    const TensorInfo* info = o.header.find(p.key);
    const std::string where = cat("checkpoint(", dir_, "/", p.file, ")");
    if (!info) throw Error(where, cat("has no tensor ", p.key, ", which the manifest places there for ", name), "save the checkpoint again");
    if (info->dtype != t.dtype || info->shape != std::vector<std::int64_t>{p.count})
      throw Error(where, cat("holds ", p.key, " as ", safetensors_dtype(info->dtype), " of ", info->shape.size() == 1 ? info->shape[0] : -1,
                             " elements; the manifest expects ", safetensors_dtype(t.dtype), " of ", p.count),
                  "save the checkpoint again");
    return o.header.data_start + info->begin;
  }
  const Manifest& manifest() const { return *m_; }
  const std::string& dir() const { return dir_; }

 private:
  const Manifest* m_;
  std::string dir_;
  std::map<std::string, Open> files_;
};

// Fills elements [first, first + count) of an entry's shard (box `offset`, `extent` of `global`)
// into host buffer `out` (count elements of X) from tensor `name`, elements outside `logical` left
// as they are in `out`.
template <class X>
void fill(Sources& src, const std::string& name, const std::vector<std::int64_t>& global, const std::vector<std::int64_t>& logical,
          const std::vector<std::int64_t>& offset, const std::vector<std::int64_t>& extent, std::int64_t first, std::int64_t count,
          X* out) {
  const auto it = src.manifest().tensors.find(name);
  const std::string where = cat("checkpoint(", src.dir(), ")");
  if (it == src.manifest().tensors.end())
    throw Error(where, cat("has no tensor ", name), "load a checkpoint of this model (and with optimizer state, for a resume)");
  const TensorRecord& t = it->second;
  if (t.logical != logical)
    throw Error(where, cat("tensor ", name, " has the shape ", join(t.logical, "x"), "; this model's is ", join(logical, "x")),
                "load a checkpoint of a model of the same sizes");
  const std::size_t r = global.size(), es = size_of(t.dtype);
  std::vector<std::uint64_t> bases(t.pieces.size());
  for (std::size_t i = 0; i < t.pieces.size(); ++i) bases[i] = src.locate(name, t, t.pieces[i]);
  // The saved pieces' runs by their first global linear index: begin -> (end, (piece, element)).
  std::map<std::int64_t, std::pair<std::int64_t, std::pair<std::size_t, std::int64_t>>> runs;
  for (std::size_t i = 0; i < t.pieces.size(); ++i) {
    const PieceRecord& p = t.pieces[i];
    std::int64_t el = 0;
    for_each_run(t.global, p.box_offset, p.box_extent, p.first, p.count, [&](std::int64_t b, std::int64_t e) {
      runs[b] = {e, {i, el}};
      el += e - b;
    });
  }
  // What this rank wants: (element of out, saved global linear index, length), inside `logical`.
  struct Want {
    std::int64_t dst, pos, len;
  };
  std::vector<Want> want;
  bool same_rows = true;  // only the leading dim may differ (padding rows): linear indices agree
  std::int64_t row_stride = 1;
  for (std::size_t d = 1; d < r; ++d) {
    same_rows = same_rows && global[d] == t.global[d] && logical[d] == global[d];
    row_stride *= global[d];
  }
  if (same_rows) {
    const std::int64_t limit = logical[0] * row_stride;
    std::int64_t dst = 0;
    for_each_run(global, offset, extent, first, count, [&](std::int64_t b, std::int64_t e) {
      if (b < std::min(e, limit)) want.push_back({dst, b, std::min(e, limit) - b});
      dst += e - b;
    });
  } else {  // row by row, mapping each position to the saved tensor's strides
    const std::int64_t L = extent[r - 1];
    std::vector<std::int64_t> idx(r);
    for (std::int64_t i = first; i < first + count;) {
      const std::int64_t row = i / L, col = i % L, n = std::min(L - col, first + count - i);
      std::int64_t rem = row;
      for (std::size_t d = r - 1; d-- > 0;) {
        idx[d] = rem % extent[d] + offset[d];
        rem /= extent[d];
      }
      idx[r - 1] = offset[r - 1] + col;
      bool inside = true;
      for (std::size_t d = 0; d + 1 < r; ++d) inside = inside && idx[d] < logical[d];
      const std::int64_t c_end = std::min(idx[r - 1] + n, logical[r - 1]);
      if (inside && idx[r - 1] < c_end) {
        std::int64_t lin = 0;
        for (std::size_t d = 0; d < r; ++d) lin = lin * t.global[d] + idx[d];
        want.push_back({i - first, lin, c_end - idx[r - 1]});
      }
      i += n;
    }
  }
  std::vector<std::byte> buf;
  for (const Want& w : want) {
    std::int64_t pos = w.pos;
    X* dst = out + w.dst;
    while (pos < w.pos + w.len) {
      auto it2 = runs.upper_bound(pos);
      if (it2 == runs.begin() || std::prev(it2)->second.first <= pos)
        throw Error(where, cat("tensor ", name, ": element ", pos, " is in no piece"), "save the checkpoint again");
      --it2;
      const auto& [end, at] = it2->second;
      const std::int64_t take = std::min(w.pos + w.len, end) - pos;
      const std::int64_t element = at.second + (pos - it2->first);
      buf.resize(static_cast<std::size_t>(take) * es);
      src.open(t.pieces[at.first].file).fd->read_all_at(buf.data(), buf.size(), bases[at.first] + static_cast<std::uint64_t>(element) * es);
      for (std::int64_t k = 0; k < take; ++k) dst[k] = convert_element<X>(t.dtype, buf.data() + static_cast<std::size_t>(k) * es);
      dst += take;
      pos += take;
    }
  }
}

}  // namespace detail

struct LoadOptions {
  bool optimizer = true;  // also the optimizer state and step (false: the weights only)
};

// Loads the checkpoint at `path` (a step directory, or a directory with `latest`) into what this
// rank holds of model and dp, whatever mesh, strategy and precision saved it. Every rank calls it.
template <class Model, class DP, CheckpointMesh M>
RunState load(const std::string& path, Model& model, DP& dp, M& mesh, LoadOptions opt = {}) {
  using T = typename Model::value_type;
  using G = master_t<T>;
  auto& world = mesh.world();
  std::string dir;
  Manifest m;
  std::string err = detail::attempt([&] {
    dir = resolve(path);
    std::ifstream in(cat(dir, "/manifest.json"), std::ios::binary);
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    m = parse(text, cat(dir, "/manifest.json"));
    if constexpr (requires { model.config.heads; })
      if (m.model.contains("heads") && m.model["heads"] != model.config.heads)
        throw Error(cat("checkpoint(", dir, ")"), cat("was saved with ", m.model["heads"].dump(), " heads; this model has ", model.config.heads),
                    "load it into a model of the same sizes");
  });
  // Every rank resolved and parsed the same files; a failure is everyone's (and the same message).
  if (!err.empty()) throw Error("checkpoint::load", err, "pass a complete, valid checkpoint");
  detail::verify_files(m, dir, world);
  check_coverage(m, cat(dir, "/manifest.json"));  // after the sizes are verified: they bound its work

  detail::Sources src(m, dir);
  const bool has_master = std::any_of(m.tensors.begin(), m.tensors.end(), [](const auto& kv) { return kv.first.starts_with("master/"); });
  auto& dev = model.dev();
  auto units = model.units();
  err = detail::attempt([&] {
    for (std::size_t u = 0; u < units.size(); ++u) {
      const auto h = dp.holding(u);
      for (const nn::UnitEntry& e : units[u].entries()) {
        const auto g = detail::dims(e.global), l = detail::dims(e.logical), off = detail::dims(e.box_offset), ext = detail::dims(e.local);
        // Fills the part of [lo, lo + n) of the unit that is this entry, at p (element lo).
        auto load_range = [&]<class X>(const std::string& kind, X* p, std::int64_t lo, std::int64_t n) {
          const std::int64_t a = std::max(lo, e.offset), b = std::min(lo + n, e.offset + e.numel);
          if (a >= b) return;
          std::vector<X> host(static_cast<std::size_t>(b - a));
          dev.to_host(host.data(), p + (a - lo), host.size() * sizeof(X));  // keeps padding as it is
          detail::fill(src, cat(kind, "/", e.name), g, l, off, ext, a - e.offset, b - a, host.data());
          dev.from_host(p + (a - lo), host.data(), host.size() * sizeof(X));
        };
        const std::string precise = has_master ? "master" : "param";
        load_range.template operator()<T>(precise, h.values, h.values_lo, h.values_n);
        if (h.master) load_range.template operator()<G>(precise, h.master, h.lo, h.n);
        if (opt.optimizer)
          for (std::size_t k = 0; k < h.state.size(); ++k)
            load_range.template operator()<std::remove_pointer_t<std::remove_cvref_t<decltype(h.state[0])>>>(DP::rule_type::state_names[k], h.state[k], h.lo, h.n);
      }
    }
    dev.synchronize();
  });
  detail::agree(world, err, "loading the checkpoint");
  RunState st;
  if (opt.optimizer) {
    dp.restore(m.optimizer.value("steps", std::int64_t{0}), m.optimizer.value("skipped", std::int64_t{0}));
    st.step = m.run.value("step", std::int64_t{0});
    st.loader_position = m.run.value("loader_position", std::int64_t{0});
    st.seed = m.run.value("seed", std::uint64_t{0});
    if (m.run.contains("extra")) st.extra = m.run["extra"];
  } else {
    dp.restore(0, 0);
  }
  return st;
}

namespace detail {
// A world of one process (for Reader).
struct Solo {
  int rank() const { return 0; }
  int size() const { return 1; }
  template <class X>
  void all_reduce(std::span<X>, ReduceOp = ReduceOp::sum) {}
};
}  // namespace detail

// A checkpoint opened by one process, verified as load() verifies it (manifest, coverage, every
// file's size and hash); read() returns a tensor's logical part whole, row-major, in any element
// type. For tools (weft-export) and tests.
class Reader {
 public:
  explicit Reader(const std::string& path) : dir_(resolve(path)) {
    std::ifstream in(cat(dir_, "/manifest.json"), std::ios::binary);
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    m_ = parse(text, cat(dir_, "/manifest.json"));
    detail::Solo solo;
    detail::verify_files(m_, dir_, solo);
    check_coverage(m_, cat(dir_, "/manifest.json"));  // after the sizes are verified: they bound its work
  }
  const Manifest& manifest() const { return m_; }
  const std::string& dir() const { return dir_; }
  bool has(const std::string& name) const { return m_.tensors.contains(name); }
  const std::vector<std::int64_t>& shape(const std::string& name) const { return record(name).logical; }

  template <class X>
  std::vector<X> read(const std::string& name) const {
    const std::vector<std::int64_t>& l = record(name).logical;
    std::int64_t n = 0;
    manifest_detail_product(l, n);
    std::vector<X> out(static_cast<std::size_t>(n));
    detail::Sources src(m_, dir_);
    if (n > 0) detail::fill(src, name, l, l, std::vector<std::int64_t>(l.size(), 0), l, 0, n, out.data());
    return out;
  }

 private:
  static void manifest_detail_product(const std::vector<std::int64_t>& d, std::int64_t& n) { checkpoint::detail::product(d, n); }
  const TensorRecord& record(const std::string& name) const {
    const auto it = m_.tensors.find(name);
    if (it == m_.tensors.end()) throw Error(cat("checkpoint(", dir_, ")"), cat("has no tensor ", name), "ask for one of the manifest's tensors");
    return it->second;
  }
  std::string dir_;
  Manifest m_;
};

}  // namespace weft::checkpoint
