// Command lines of weft's programs: CLI11 with weft's exit statuses (docs/training.md), and range
// checks whose messages read well.
#pragma once

#include <CLI/CLI.hpp>

#include <cmath>
#include <cstdlib>
#include <functional>
#include <optional>
#include <string>

#include "weft/core/error.hpp"
#include "weft/train/options.hpp"

namespace weft::cli {

// Parses argv into app. Returns the exit status when the program should stop now: 0 after --help,
// 2 for a bad option (CLI11 has printed why); nullopt to go on.
inline std::optional<int> parse(CLI::App& app, int argc, char** argv) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) { return app.exit(e); } catch (const CLI::ParseError& e) {
    app.exit(e);
    return 2;
  }
  return std::nullopt;
}

// Range checks for numeric options: NaN and infinities are refused (NaN passes every comparison, so
// CLI11's own range checks let it through), and the messages print the bound as written.
inline CLI::Validator number_check(std::function<bool(double)> ok, std::string rule) {
  return CLI::Validator(
      [ok, rule](std::string& s) -> std::string {
        char* end = nullptr;
        const double v = std::strtod(s.c_str(), &end);
        if (s.empty() || end != s.c_str() + s.size()) return weft::cat("'", s, "' is not a number");
        if (!std::isfinite(v)) return weft::cat(s, " is not a finite number");
        if (!ok(v)) return weft::cat(s, " is out of range: use a number ", rule);
        return "";
      },
      weft::cat("NUMBER ", rule));
}
inline CLI::Validator at_least(double lo) {
  return number_check([lo](double v) { return v >= lo; }, weft::cat(">= ", lo));
}
inline CLI::Validator above(double lo) {
  return number_check([lo](double v) { return v > lo; }, weft::cat("> ", lo));
}
inline CLI::Validator at_most(double hi) {
  return number_check([hi](double v) { return v <= hi; }, weft::cat("<= ", hi));
}

// --layers, --heads, --width, --seq, --vocab, --kv-heads, --hidden and --tie-embeddings: the sizes
// over a model family's preset.
inline void add_sizes(CLI::App& app, train::Sizes& s) {
  app.add_option("--layers", s.layers, "override the preset's layers")->check(at_least(1));
  app.add_option("--heads", s.heads, "override the preset's heads")->check(at_least(1));
  app.add_option("--width", s.width, "override the preset's width")->check(at_least(1));
  app.add_option("--seq", s.seq, "override the preset's sequence length")->check(at_least(1));
  app.add_option("--vocab", s.vocab, "override the preset's vocabulary")->check(at_least(1));
  app.add_option("--kv-heads", s.kv_heads, "override the preset's key-value heads (llama)")->check(at_least(1));
  app.add_option("--hidden", s.hidden, "override the preset's MLP hidden width (llama)")->check(at_least(1));
  app.add_option("--tie-embeddings", s.tied,
                 "true or false: whether the LM head reads the embedding table, over the "
                 "preset's (llama; GPT-2's is always tied)");
  app.add_option("--experts", s.experts, "override the preset's experts per MoE layer (mixtral)")->check(at_least(1));
  app.add_option("--top-k", s.top_k, "override the preset's experts each token goes to (mixtral)")->check(at_least(1));
  app.add_option(
      "--capacity-factor", s.capacity_factor,
      "0: dropless (the default); F > 0: each sample sends at most ceil(F T k / E) of its tokens to an expert, "
      "the rest dropped in token order (mixtral)");
  app.add_option_function<std::string>(
         "--router",
         [&s](const std::string& v) {
           if (v != "softmax" && v != "sigmoid")
             throw CLI::ValidationError("--router", cat("'", v, "' is no router; use softmax or sigmoid"));
           s.sigmoid = v == "sigmoid";
         },
         "softmax (the preset's) or sigmoid: each expert's score sigmoid(logit), as DeepSeek-V3's, without the "
         "z-loss (mixtral)")
      ->type_name("softmax|sigmoid");
  app.add_option("--expert-bias", s.expert_bias,
                 "RATE: aux-loss-free balancing (DeepSeek-V3's): a per-expert bias on the choice of experts, moved "
                 "by RATE against each expert's load every step (1e-3 is DeepSeek-V3's; 0 holds it at 0) "
                 "(mixtral; docs/moe.md)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--expert-groups", s.groups,
                 "G: group-limited routing (DeepSeek-V3's n_group): the experts in G groups of neighbours, a token's "
                 "top k from its --top-groups best groups (mixtral; docs/moe.md)")
      ->check(CLI::PositiveNumber);
  app.add_option("--top-groups", s.top_groups, "K: the groups a token's experts come from (with --expert-groups)")
      ->check(CLI::PositiveNumber);
}

}  // namespace weft::cli
