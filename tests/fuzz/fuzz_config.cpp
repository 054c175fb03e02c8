// Fuzz target: the config loader (lib/config) on TOML text plus `--set` overrides.
// Input: the TOML text, then up to four overrides ("section.key=value"), separated by NUL bytes.
// A config that loads must print (to_toml) as TOML that loads again to the same text.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "config/config.hpp"
#include "fuzz_util.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using trident::fuzz::expect;
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  std::vector<std::string> pieces;
  size_t begin = 0;
  while (pieces.size() < 5) {
    const size_t nul = input.find('\0', begin);
    pieces.emplace_back(input.substr(begin, nul == std::string_view::npos ? nul : nul - begin));
    if (nul == std::string_view::npos) break;
    begin = nul + 1;
  }
  const std::string source = "fuzz.toml";
  const std::vector<std::string> overrides(pieces.begin() + 1, pieces.end());
  trident::Config config;
  try {
    config = trident::parse_config(pieces[0], source, overrides);
  } catch (const trident::Error& e) {
    // A value an override gave is named as '--set' (lib/config), any other by the file.
    const bool names_override = !overrides.empty() && std::string(e.what()).rfind("--set", 0) == 0;
    trident::fuzz::expect_one_line_naming(e, names_override ? "--set" : source);
    return 0;
  }
  // What the loader accepted and printed, it must accept again, unchanged.
  const std::string printed = config.to_toml();
  try {
    const trident::Config again = trident::parse_config(printed, "printed.toml");
    expect(again.to_toml() == printed, "to_toml does not round-trip:\n" + printed);
  } catch (const trident::Error& e) {
    expect(false, "the printed config does not load (" + std::string(e.what()) + "):\n" + printed);
  }
  return 0;
}
