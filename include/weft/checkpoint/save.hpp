// Saving checkpoints: the policies (Sharded, Consolidated), what each rank stages, the durable
// protocol (files, directory rename, manifest, latest, pruning) and the asynchronous Saver.
// checkpoint.hpp describes the whole.
#pragma once

#include <map>
#include <mutex>
#include <optional>
#include <thread>

#include "weft/checkpoint/common.hpp"
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

// One piece this rank saves: host bytes and where they lie.
struct Staged {
  std::string tensor;  // "param/wte"
  DType dtype = DType::f32;
  std::vector<std::int64_t> global, logical, box_offset, box_extent;
  std::string layout;
  std::int64_t first = 0, count = 0;
  std::vector<std::byte> bytes;
};

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

}  // namespace weft::checkpoint
