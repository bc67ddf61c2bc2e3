// Command lines of the examples: weft's (train/command_line.hpp), by their short names.
#pragma once

#include <weft/train/command_line.hpp>

namespace examples {
using weft::cli::above;
using weft::cli::at_least;
using weft::cli::at_most;
using weft::cli::number_check;
using weft::cli::parse;
}  // namespace examples
