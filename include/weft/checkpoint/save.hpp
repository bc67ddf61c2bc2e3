// Saving checkpoints: the policies (Sharded, Consolidated), what each rank stages, the durable
// protocol (files, directory rename, manifest, latest, pruning) and the asynchronous Saver.
// checkpoint.hpp describes the whole.
#pragma once

#include <map>
#include <mutex>
#include <optional>
#include <thread>

#include "weft/checkpoint/common.hpp"
#include "weft/checkpoint/lock.hpp"
#include "weft/checkpoint/pieces.hpp"
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

struct SaveOptions {
  int keep = 0;  // keep the newest `keep` checkpoints (0: all)
};

namespace detail {

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
        Staged s{cat(kind, "/", e.name),
                 dtype_of<X>,
                 dims(e.global),
                 dims(e.logical),
                 dims(e.box_offset),
                 dims(e.local),
                 e.layout,
                 a - e.offset,
                 b - a,
                 std::vector<std::byte>(static_cast<std::size_t>(b - a) * sizeof(X))};
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

// Removes step directory `name` of root so that a crash at any moment leaves either the complete
// checkpoint or a directory no reader takes for one: first renamed (atomically, durably) to
// <name>.deleting, then its files removed one by one. prepare() clears what a crash left.
inline void remove_step(const std::string& root, const std::string& name) {
  namespace fs = std::filesystem;
  const fs::path from = fs::path(root) / name, to = fs::path(root) / (name + ".deleting");
  std::error_code ec;
  fs::remove_all(to, ec);
  point("prune rename");
  if (std::rename(from.c_str(), to.c_str()) != 0)
    detail::sys_fail(cat("checkpoint(", from.string(), ")"), "cannot rename it for removal", errno);
  sync_directory(root);
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(to)) files.push_back(e.path());
  for (const fs::path& f : files) {
    point("prune remove");
    fs::remove_all(f);
  }
  fs::remove(to);
}

// Which complete checkpoints a save of step `step` with `keep` > 0 removes, oldest first: of the
// checkpoints of this run's line, the steps up to `step`, all but the newest `keep`. Never `step`
// itself, nor what `latest` names; a later step, left by a run this one rolled back from (a resume
// from an earlier step), is kept and not counted. (torchtitan's keep_latest_k sorts every step
// directory by its number and keeps the highest k, so a rolled-back run's new checkpoints, the lowest
// numbers, are the ones it deletes.)
inline std::vector<std::string> pruned(const std::vector<std::pair<std::int64_t, std::string>>& complete,
                                       std::int64_t step, int keep, const std::string& latest) {
  std::vector<std::string> line;
  for (const auto& [s, n] : complete)
    if (s <= step) line.push_back(n);
  std::vector<std::string> out;
  const std::string written = step_name(step);
  for (std::size_t i = 0; i + static_cast<std::size_t>(keep) < line.size(); ++i)
    if (line[i] != written && line[i] != latest) out.push_back(line[i]);
  return out;
}

// Rank 0's part of finishing a save: rename, manifest, latest, pruning.
inline void publish(const std::string& root, Manifest m, const std::vector<Digest>& digests, bool sharded, int keep) {
  const std::string name = step_name(m.step), tmp = cat(root, "/", name, ".tmp"), dir = cat(root, "/", name);
  if (sharded) {
    for (std::size_t r = 0; r < digests.size(); ++r) {
      m.add_file({rank_file(static_cast<int>(r)), digests[r]});
      add_pieces(m, tmp, rank_file(static_cast<int>(r)));
    }
  } else {
    m.add_file({"model.safetensors", digests[0]});
    add_pieces(m, tmp, "model.safetensors");
  }
  check_coverage(m, tmp);
  point("directory fsync");
  sync_directory(tmp);
  point("directory rename");
  if (std::rename(tmp.c_str(), dir.c_str()) != 0)
    detail::sys_fail(cat("checkpoint(", dir, ")"), cat("cannot rename ", tmp), errno);
  sync_directory(root);
  point("manifest");
  write_atomic(cat(dir, "/manifest.json"), to_json(m).dump(1));
  point("latest");
  write_atomic(cat(root, "/latest"), name + "\n");
  if (keep > 0) {
    for (const std::string& old : pruned(complete_checkpoints(root), m.step, keep, latest_of(root)))
      remove_step(root, old);
    sync_directory(root);
  }
}

// Before a save of step N: stale step_N.tmp and *.deleting directories go; an existing step_N is
// replaced, and if latest names it, latest first moves back to the newest other complete
// checkpoint (or goes).
inline void prepare(const std::string& root, std::int64_t step) {
  namespace fs = std::filesystem;
  fs::create_directories(root);
  const std::string name = step_name(step);
  fs::remove_all(fs::path(root) / (name + ".tmp"));
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(root, ec))
    if (const std::string n = e.path().filename().string(); n.starts_with("step_") && n.ends_with(".deleting"))
      fs::remove_all(e.path());
  if (fs::exists(fs::symlink_status(fs::path(root) / name))) {
    if (latest_of(root) == name) {
      std::string other;
      for (const auto& [s, n] : complete_checkpoints(root))
        if (n != name) other = n;
      if (other.empty()) fs::remove(fs::path(root) / "latest");
      else write_atomic(cat(root, "/latest"), other + "\n");
    }
    remove_step(root, name);
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
    nlohmann::json record = detail::piece_record(s);
    record["dtype"] = safetensors_dtype(s.dtype);
    meta.push_back(std::move(record));
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
        w = Staged{
            s.tensor, s.dtype,  s.global, s.logical, std::vector<std::int64_t>(s.global.size(), 0),
            s.global, s.layout, 0,        numel,     std::vector<std::byte>(static_cast<std::size_t>(numel) * es)};
      }
      std::int64_t src = 0;
      for_each_run(s.global, s.box_offset, s.box_extent, s.first, s.count, [&](std::int64_t b, std::int64_t e) {
        std::memcpy(w.bytes.data() + static_cast<std::size_t>(b) * es,
                    s.bytes.data() + static_cast<std::size_t>(src) * es, static_cast<std::size_t>(e - b) * es);
        src += e - b;
      });
    }
  std::vector<Staged> out;
  for (auto& [n, s] : whole) out.push_back(std::move(s));
  return out;
}

// The model's configuration record (its record(): every field that shapes its parameters), which a
// load compares field by field.
template <class Model>
nlohmann::json model_json(const Model& model) {
  nlohmann::json j = nlohmann::json::object();
  if constexpr (requires { model.record(); })
    for (const auto& [k, v] : model.record()) j[k] = v;
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
  explicit Saver(std::string root, SaveOptions opt = {}, bool async = false)
      : root_(std::move(root)), opt_(opt), async_(async) {}
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
    // World rank 0 publishes and prunes: it holds the directory's lock (lock.hpp) from its first save.
    std::string err = world.rank() == 0 ? detail::attempt([&] {
      if (!lock_.held()) lock_ = DirectoryLock(root_);
      detail::prepare(root_, state.step);
    })
                                        : std::string();
    detail::agree(world, err, "preparing the checkpoint directory", detail::kSaveUnchanged);
    std::vector<detail::Staged> staged;
    err = detail::attempt([&] { staged = detail::stage(model, dp, mesh); });
    detail::agree(world, err, "copying the state to host memory", detail::kSaveUnchanged);

    manifest_ = Manifest{};
    manifest_.policy = Policy::name;
    manifest_.step = state.step;
    manifest_.data = mesh.comm(Axis::data).size();
    manifest_.tensor = mesh.comm(Axis::tensor).size();
    manifest_.pipe = mesh.comm(Axis::pipe).size();
    manifest_.context = mesh.comm(Axis::context).size();
    manifest_.strategy = DP::name();
    manifest_.family = state.family;
    manifest_.precision = precision_t<typename Model::value_type>::name();
    manifest_.model = detail::model_json(model);
    manifest_.optimizer = {{"rule", DP::rule_type::name}, {"steps", dp.steps()}, {"skipped", dp.skipped()}};
    manifest_.run = {
        {"step", state.step}, {"loader_position", state.loader_position}, {"seed", state.seed}, {"extra", state.extra}};

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
    bool writes = std::same_as<Policy, Sharded> || world.rank() == 0;  // not const: a constant when Sharded
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
    detail::agree(world, error_, "writing a checkpoint file", detail::kSaveUnchanged);
    std::array<std::int64_t, 2> mine{static_cast<std::int64_t>(digest_.bytes),
                                     std::bit_cast<std::int64_t>(digest_.xxh3)};
    std::vector<std::int64_t> all(2 * static_cast<std::size_t>(world.size()));
    world.all_gather(std::span<const std::int64_t>(mine), std::span<std::int64_t>(all));
    std::string err;
    if (world.rank() == 0) {
      std::vector<Digest> digests;
      const int files = std::same_as<Policy, Sharded> ? world.size() : 1;
      for (int r = 0; r < files; ++r)
        digests.push_back({static_cast<std::uint64_t>(all[2 * static_cast<std::size_t>(r)]),
                           std::bit_cast<std::uint64_t>(all[2 * static_cast<std::size_t>(r) + 1])});
      err = detail::attempt(
          [&] { detail::publish(root_, manifest_, digests, std::same_as<Policy, Sharded>, opt_.keep); });
    }
    detail::agree(world, err, "publishing the checkpoint", detail::kSaveUnchanged);
  }

  std::string root_;
  DirectoryLock lock_;  // world rank 0's, from its first save
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

}  // namespace weft::checkpoint
