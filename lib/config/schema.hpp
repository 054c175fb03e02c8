#pragma once
// The configuration schema as data, for documentation and help text: one entry per key, in the
// order of config.hpp (and of Config::to_toml). Also the TOML text formatting used by to_toml.
// docs/config.md's key table is reference_markdown() verbatim (tests/test_config.cpp checks it).
#include <string>
#include <string_view>
#include <vector>

namespace trident::config {

struct KeyReference {
  std::string name;         // "section.key"
  std::string type;         // "integer" | "float" | "boolean" | "string" | "array of integers"
  std::string default_toml; // the default as TOML text ("2", "0.0006", "\"1f1b\"", "[]")
  std::string constraints;  // e.g. ">= 1", "`cpu` or `cuda`"; empty: none
  std::string meaning;
};

// Every key, in schema order.
const std::vector<KeyReference>& key_reference();

// The Markdown table of every key (| Key | Type | Default | Constraints | Meaning |).
std::string reference_markdown();

// A double as a TOML float that reads back to the same bits: shortest round-trip digits,
// fixed notation for moderate exponents ("0.0006", "25.0"), else scientific ("1e-8").
std::string toml_float(double v);

// A string as a TOML basic string, quotes included, with every special character escaped.
std::string toml_string(std::string_view s);

}  // namespace trident::config
