// Loading checkpoints into a model: what this rank holds of it, from the byte ranges of the pieces
// that overlap it, whatever mesh, strategy and precision saved it. verify.hpp checks the checkpoint
// first; checkpoint.hpp describes the whole.
#pragma once

#include "weft/checkpoint/verify.hpp"
#include "weft/comm/fingerprint.hpp"
#include "weft/core/precision.hpp"
#include "weft/nn/unit.hpp"

namespace weft::checkpoint {

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
  std::shared_ptr<const detail::Read> read;
  std::string err = detail::attempt([&] {
    read = detail::read_shared(resolve(path));
    if constexpr (requires { model.record(); })
      detail::check_model(read->m.model, model.record(), cat("checkpoint(", read->dir, ")"));
  });
  detail::agree(world, err, "reading the checkpoint's manifest", "pass a complete, valid checkpoint of this model");
  // Every rank reads the same checkpoint: the same directory (ranks started in other working
  // directories resolve a relative path elsewhere) and the same manifest.
  {
    std::error_code ec;
    const auto where = std::filesystem::weakly_canonical(read->dir, ec);
    Fingerprint fp;
    fp.add("checkpoint", cat(ec ? read->dir : where.string(), " (manifest xxh3 ", hex64(read->xxh3), ")"));
    fp.agree(world,
             "give every rank the same checkpoint: an absolute path, or the same working directory; where the "
             "path holds `latest`, it moved between the ranks' reads (another trainer saving or pruning there): "
             "resume from a step directory");
  }
  const Manifest& m = read->m;
  const std::string& dir = read->dir;
  detail::verify_files(m, dir, world);
  check_coverage(m, cat(dir, "/manifest.json"));  // after the sizes are verified: they bound its work

  detail::Sources src(m, dir);
  const bool has_master =
      std::any_of(m.tensors.begin(), m.tensors.end(), [](const auto& kv) { return kv.first.starts_with("master/"); });
  auto& dev = model.dev();
  auto units = model.units();
  err = detail::attempt([&] {
    for (std::size_t u = 0; u < units.size(); ++u) {
      const auto h = dp.holding(u);
      for (const nn::UnitEntry& e : units[u].entries()) {
        const auto g = detail::dims(e.global), l = detail::dims(e.logical), off = detail::dims(e.box_offset),
                   ext = detail::dims(e.local);
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
            load_range.template operator()<std::remove_pointer_t<std::remove_cvref_t<decltype(h.state[0])>>>(
                DP::rule_type::state_names[k], h.state[k], h.lo, h.n);
      }
    }
    dev.synchronize();
  });
  detail::agree(world, err, "loading the checkpoint", detail::kLoadFailed);
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

}  // namespace weft::checkpoint
