// Device-neutral memory accounting: categories, statistics, and the owned block that every device's
// allocator hands out (so tensors hold one Allocation type whatever the device).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <utility>

namespace weft {

// master_weights: the f32 copy of bf16 weights that the optimizer updates (mixed precision only).
enum class Category : std::uint8_t {
  parameters,
  gradients,
  optimizer_state,
  master_weights,
  activations,
  communication,
  other
};
inline constexpr std::size_t kCategories = 7;

constexpr const char* name(Category c) {
  constexpr const char* names[] = {"parameters",    "gradients", "optimizer_state", "master_weights", "activations",
                                   "communication", "other"};
  return names[static_cast<int>(c)];
}

struct MemoryStats {
  std::array<std::int64_t, kCategories> current{}, peak{};
  std::int64_t total_current = 0, total_peak = 0;
  // Every byte and non-empty block allocated since the start, never reset: the difference over a step is what
  // the step allocated (tests/models/gpt2/replay.cpp holds it to the plan's, so a step allocates nothing the
  // plan does not call for).
  std::array<std::int64_t, kCategories> allocated{};
  std::int64_t allocations = 0;

  std::int64_t current_of(Category c) const { return current[static_cast<std::size_t>(c)]; }

  // The accounting every allocator does around its own allocation and release.
  void on_allocate(std::int64_t bytes, Category c) {
    const auto i = static_cast<std::size_t>(c);
    current[i] += bytes;
    allocated[i] += bytes;
    if (bytes > 0) ++allocations;
    peak[i] = peak[i] > current[i] ? peak[i] : current[i];
    total_current += bytes;
    total_peak = total_peak > total_current ? total_peak : total_current;
  }
  void on_release(std::int64_t bytes, Category c) {
    current[static_cast<std::size_t>(c)] -= bytes;
    total_current -= bytes;
  }
  // Starts a new peak measurement from the current usage.
  void reset_peak() {
    peak = current;
    total_peak = total_current;
  }
  std::int64_t peak_of(Category c) const { return peak[static_cast<std::size_t>(c)]; }
};

// What an Allocation returns itself to. Each device's allocator implements it (host now, CUDA later),
// so tensors hold one Allocation type whatever the device.
class Releaser {
 public:
  virtual void release(void* p, std::int64_t bytes, Category c) noexcept = 0;

 protected:
  ~Releaser() = default;
};

// An owned block; returns itself to its allocator on destruction.
class Allocation {
 public:
  Allocation() = default;
  Allocation(const Allocation&) = delete;
  Allocation& operator=(const Allocation&) = delete;
  Allocation(Allocation&& o) noexcept { *this = std::move(o); }
  Allocation& operator=(Allocation&& o) noexcept;
  ~Allocation() { reset(); }

  // For allocators: wrap a block they handed out, to be returned to `owner` on destruction.
  static Allocation adopt(Releaser* owner, void* p, std::int64_t n, Category c) { return Allocation(owner, p, n, c); }

  void* data() const { return ptr_; }
  std::int64_t bytes() const { return bytes_; }
  Category category() const { return cat_; }
  void reset();

 private:
  Allocation(Releaser* a, void* p, std::int64_t n, Category c) : owner_(a), ptr_(p), bytes_(n), cat_(c) {}
  friend class HostAllocator;
  Releaser* owner_ = nullptr;
  void* ptr_ = nullptr;
  std::int64_t bytes_ = 0;
  Category cat_ = Category::other;
};

inline Allocation& Allocation::operator=(Allocation&& o) noexcept {
  if (this != &o) {
    reset();
    owner_ = std::exchange(o.owner_, nullptr);
    ptr_ = std::exchange(o.ptr_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
    cat_ = o.cat_;
  }
  return *this;
}

inline void Allocation::reset() {
  if (owner_) owner_->release(ptr_, bytes_, cat_);
  owner_ = nullptr;
  ptr_ = nullptr;
  bytes_ = 0;
}

}  // namespace weft
