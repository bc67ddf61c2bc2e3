// defines: test::hf::scratch, test::hf::edited_copy, test::hf::imported_equals_reference,
// test::hf::same_tensors: what the tests of a family's transformers directories (models/<family>/hf.hpp)
// share: scratch directories, a fixture's copy with one config.json key changed, an imported
// checkpoint against a tools/reference fixture's weft tensors, and two directories' tensors.
#pragma once

#include <doctest/doctest.h>

#include <unistd.h>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "weft/checkpoint/checkpoint.hpp"
#include "weft/checkpoint/import_dir.hpp"
#include "weft/models/llama/hf.hpp"

namespace weft::test::hf {

// An empty path under the temporary directory, this process's own.
inline std::string scratch(const std::string& prefix, const std::string& name) {
  const auto p = std::filesystem::temp_directory_path() / cat(prefix, ::getpid(), "_", name);
  std::filesystem::remove_all(p);
  return p.string();
}

// `dir`: a copy of the model directory `fixture` with config.json's `key` set to `value` (JSON text).
inline std::string edited_copy(const std::string& fixture, const std::string& dir, const std::string& key,
                               const std::string& value) {
  std::filesystem::create_directories(dir);
  std::filesystem::copy_file(fixture + "/model.safetensors", dir + "/model.safetensors");
  auto j = llama::hf_detail::read_json(fixture + "/config.json", "test");
  j[key] = nlohmann::json::parse(value);
  std::ofstream(dir + "/config.json") << j.dump(2);
  return dir;
}

// Every value/<name> of the reference file (`reference_dir`/reference.safetensors) against the
// imported checkpoint's param/<name>, bit for bit (F64 in, F64 out); returns how many were compared.
inline int imported_equals_reference(const std::string& checkpoint, const std::string& reference_dir) {
  const checkpoint::ImportDir ref(reference_dir, "reference", "the reference");
  const checkpoint::Reader r(checkpoint);
  int compared = 0;
  for (const auto& name : ref.names()) {
    if (!name.starts_with("value/")) continue;
    const std::string weft = name.substr(6);
    INFO(weft);
    CHECK(r.read<double>("param/" + weft) == ref.read(name));
    ++compared;
  }
  return compared;
}

// Every tensor of the model directory `want` in `got`, of the same shape and bits, and no other.
inline void same_tensors(const std::string& got_dir, const std::string& want_dir) {
  const checkpoint::ImportDir want(want_dir, "model", "the fixture"), got(got_dir, "model", "the export");
  CHECK(got.names().size() == want.names().size());
  for (const auto& name : want.names()) {
    INFO(name);
    REQUIRE(got.find(name) != nullptr);
    CHECK(got.find(name)->shape == want.find(name)->shape);
    CHECK(got.read(name) == want.read(name));
  }
}

}  // namespace weft::test::hf
