#pragma once
// Checks of numeric (and text) command-line values, each failing in one short line that names
// the value.
// CLI11 alone takes 99999999999999999999 for an int64 option as INT64_MAX (strtoll saturates),
// lets nan through its range checks (every comparison with nan is false) and prints its
// unbounded ranges' ends as 300-digit numbers.
#include <CLI/CLI.hpp>

#include <cstdint>
#include <limits>

namespace trident {

// A whole number in decimal within [min, max]: "must be a whole number >= 1, got 0".
CLI::Validator whole_number(int64_t min, int64_t max = std::numeric_limits<int64_t>::max());

// A finite number within [min, max]: "must be a number in [0, 1], got nan".
CLI::Validator finite_number(double min, double max);

// Every numeric option of `app` and of its subcommands, whatever their own checks: an integer
// option's text must be a decimal number its type holds (no silent saturation, no octal "010"),
// a floating-point option's a finite number.
void check_number_types(CLI::App& app);

// Every text option and argument of `app` and of its subcommands: an empty value is refused in
// one line ("--resume: must not be empty"), never taken as the option not given (`--resume ''`
// trained from scratch, `--stop ''` stopped nowhere, `--tokenizer ''` fell back to bytes).
void refuse_empty_text(CLI::App& app);

}  // namespace trident
