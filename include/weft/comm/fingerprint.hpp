// The start-up fingerprint: before the first step, every rank checks that it runs the same thing
// as rank 0 (build, types, sizes, mesh, the collectives one step issues, the options that change
// the numbers), and every rank refuses to start, naming the first field that differs and the rank,
// rather than hanging or diverging later in a mismatched collective.
//
//   weft::Fingerprint f;
//   f.add("weft version", weft::version);
//   f.add("strategy", "zero1");
//   f.add("collectives of one step", nn::describe<gpt2::Model<float>>(cfg, batch, mesh.spread()));
//   f.agree(world);  // collective; throws Error on every rank when any rank differs
//
// Fields are compared by their XXH3-64 hash (one broadcast of rank 0's hashes and two all-reduces);
// only on a difference do the two values travel, so the message can show both.
//
// This header is plain C++20 (xxHash header-only).
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "weft/comm/communicator.hpp"
#include "weft/comm/share.hpp"
#include "weft/core/error.hpp"
#include "weft/core/xxhash.hpp"

namespace weft {

class Fingerprint {
 public:
  void add(std::string field, std::string value) { fields_.emplace_back(std::move(field), std::move(value)); }
  const std::vector<std::pair<std::string, std::string>>& fields() const { return fields_; }

  // Collective over `world`. Throws Error on every rank when a rank's fields differ from rank 0's.
  template <Communicator C>
  void agree(C& world,
             const std::string& fix =
                 "start every rank from the same build with the same options (mpirun -np N <one command line>)") const {
    const int n = world.size(), me = world.rank();
    // Rank 0's field count, then its hashes.
    std::vector<std::int64_t> count{static_cast<std::int64_t>(fields_.size())};
    world.broadcast(std::span<std::int64_t>(count), 0);
    const std::int64_t f0 = count[0];
    std::vector<std::int64_t> hashes(static_cast<std::size_t>(f0));
    if (me == 0)
      for (std::size_t i = 0; i < fields_.size(); ++i) hashes[i] = hash(fields_[i].second);
    world.broadcast(std::span<std::int64_t>(hashes), 0);
    // This rank's first differing field (f0 + 1: none), then the smallest over ranks, and the lowest
    // rank with it: max over ranks of (f0 + 1 - field) * n + (n - 1 - rank).
    const std::int64_t mine_n = static_cast<std::int64_t>(fields_.size());
    std::int64_t first = f0 + 1;
    for (std::int64_t i = 0; i < std::min(f0, mine_n); ++i)
      if (hash(fields_[static_cast<std::size_t>(i)].second) != hashes[static_cast<std::size_t>(i)]) {
        first = i;
        break;
      }
    if (first == f0 + 1 && mine_n != f0) first = std::min(f0, mine_n);  // one list is a prefix of the other
    std::vector<std::int64_t> key{(f0 + 1 - first) * n + (n - 1 - me)};
    world.all_reduce(std::span<std::int64_t>(key), ReduceOp::max);
    const std::int64_t field = f0 + 1 - key[0] / n;
    const int who = static_cast<int>(n - 1 - key[0] % n);
    if (field == f0 + 1) return;
    // The field's name and both values, from rank 0 and from the rank that differs.
    const std::string name0 = share_text(world, me == 0 ? entry(field).first : std::string(), 0);
    const std::string value0 = share_text(world, me == 0 ? entry(field).second : std::string(), 0);
    const std::string value = share_text(world, me == who ? entry(field).second : std::string(), who);
    throw Error("start-up fingerprint",
                cat("world rank ", who, " differs from world rank 0 in ", name0.empty() ? cat("field ", field) : name0,
                    ": ", quote(value), " on world rank ", who, ", ", quote(value0), " on world rank 0"),
                fix);
  }

 private:
  static std::int64_t hash(const std::string& s) { return static_cast<std::int64_t>(XXH3_64bits(s.data(), s.size())); }
  // Field i, or ("", "<absent>") past the end of this rank's list.
  std::pair<std::string, std::string> entry(std::int64_t i) const {
    if (i < static_cast<std::int64_t>(fields_.size())) return fields_[static_cast<std::size_t>(i)];
    return {"", "<absent>"};
  }
  static std::string quote(const std::string& v) {
    constexpr std::size_t most = 300;
    std::string s = v.size() > most ? v.substr(0, most) + "..." : v;
    std::replace(s.begin(), s.end(), '\n', ' ');
    return cat("'", s, "'");
  }

  std::vector<std::pair<std::string, std::string>> fields_;
};

}  // namespace weft
