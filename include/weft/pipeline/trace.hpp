// Traces of pipelined steps: Chrome / Perfetto trace events (JSON), one track per rank.
//
// Each rank records into its own lane (no locking: a lane has one writer); write() runs after the
// ranks have finished. Events are complete events ("ph": "X") with a start and a duration in
// microseconds from the trace's start, a name, a category and the stage and micro-batch where they
// apply:
//   compute    forward, backward, weight              one per action of the rank's table
//   wait       recv wait, send wait                    time blocked on a neighbour
//   collective tied all-reduce, loss all-reduce        the pipeline's own collectives
//   step       optimizer step                          recorded by the caller (the trainer)
// Optional push/pop hooks mirror every event as a named range (the GPU trainer installs NVTX).
//
// This header is plain C++20.
#pragma once

#include <chrono>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "weft/core/error.hpp"

namespace weft::pipeline {

struct TraceEvent {
  std::string name;
  std::string category;
  double start_us = 0, duration_us = 0;
  int stage = -1, micro = -1;
};

class Trace {
 public:
  using Clock = std::chrono::steady_clock;

  explicit Trace(int ranks) : lanes_(static_cast<std::size_t>(ranks)), start_(Clock::now()) {}

  double now_us() const { return std::chrono::duration<double, std::micro>(Clock::now() - start_).count(); }

  // Records an event that started at `start_us` and ends now, on rank `lane`'s track.
  void record(int lane, std::string name, std::string category, double start_us, int stage = -1, int micro = -1) {
    lanes_.at(static_cast<std::size_t>(lane))
        .push_back({std::move(name), std::move(category), start_us, now_us() - start_us, stage, micro});
  }

  // A scope that records itself on destruction (and brackets a push/pop range).
  class Scope {
   public:
    Scope(Trace* t, int lane, std::string name, std::string category, int stage = -1, int micro = -1)
        : t_(t), lane_(lane), name_(std::move(name)), category_(std::move(category)), stage_(stage), micro_(micro) {
      if (!t_) return;
      start_ = t_->now_us();
      if (t_->push) t_->push(name_.c_str());
    }
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;
    ~Scope() {
      if (!t_) return;
      if (t_->pop) t_->pop();
      t_->record(lane_, std::move(name_), std::move(category_), start_, stage_, micro_);
    }

   private:
    Trace* t_;
    int lane_;
    std::string name_, category_;
    int stage_, micro_;
    double start_ = 0;
  };

  const std::vector<TraceEvent>& lane(int r) const { return lanes_.at(static_cast<std::size_t>(r)); }
  int lanes() const { return static_cast<int>(lanes_.size()); }

  // Writes the Chrome trace JSON ({"traceEvents": [...]}, one thread per rank, named "rank r").
  void write(const std::string& path) const {
    std::FILE* f = std::fopen(path.c_str(), "w");
    if (!f) throw Error("pipeline::Trace", cat("cannot write the trace file ", path), "check the path");
    std::fprintf(f, "{\"displayTimeUnit\": \"ms\", \"traceEvents\": [\n");
    bool first = true;
    for (std::size_t r = 0; r < lanes_.size(); ++r) {
      std::fprintf(
          f,
          "%s{\"ph\": \"M\", \"name\": \"thread_name\", \"pid\": 0, \"tid\": %zu, \"args\": {\"name\": \"rank %zu\"}}",
          first ? "" : ",\n", r, r);
      first = false;
      for (const TraceEvent& e : lanes_[r])
        std::fprintf(f,
                     ",\n{\"ph\": \"X\", \"name\": \"%s\", \"cat\": \"%s\", \"pid\": 0, \"tid\": %zu, \"ts\": %.3f, "
                     "\"dur\": %.3f, \"args\": {\"stage\": %d, \"micro\": %d}}",
                     e.name.c_str(), e.category.c_str(), r, e.start_us, e.duration_us, e.stage, e.micro);
    }
    std::fprintf(f, "\n]}\n");
    const bool ok = std::ferror(f) == 0;
    if (std::fclose(f) != 0 || !ok)
      throw Error("pipeline::Trace", cat("writing the trace file ", path, " failed"), "check the disk");
  }

  std::function<void(const char*)> push;  // optional: named ranges (NVTX on the GPU)
  std::function<void()> pop;

 private:
  std::vector<std::vector<TraceEvent>> lanes_;
  Clock::time_point start_;
};

}  // namespace weft::pipeline
