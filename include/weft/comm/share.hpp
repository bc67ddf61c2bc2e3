// share_text(world, text, root): one rank's string on every rank of a group, for messages that
// must read the same everywhere (a failure's cause, a fingerprint's differing field). Two
// broadcasts: the length, then the bytes (as i32, which every back end carries).
//
// Plain C++20: any group with broadcast(std::span<T>, root) for i64 and i32.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace weft {

template <class C>
std::string share_text(C& world, const std::string& text, int root) {
  std::array<std::int64_t, 1> len{static_cast<std::int64_t>(text.size())};
  world.broadcast(std::span<std::int64_t>(len), root);
  std::vector<std::int32_t> bytes(static_cast<std::size_t>(len[0]));
  if (world.rank() == root)
    for (std::size_t i = 0; i < text.size(); ++i) bytes[i] = static_cast<unsigned char>(text[i]);
  world.broadcast(std::span<std::int32_t>(bytes), root);
  std::string out(bytes.size(), '\0');
  for (std::size_t i = 0; i < bytes.size(); ++i) out[i] = static_cast<char>(bytes[i]);
  return out;
}

}  // namespace weft
