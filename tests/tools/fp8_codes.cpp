// fp8_codes: float32 values (native byte order) on stdin, their E4M3 and E5M2 codes
// (util/fp8.hpp, saturating) on stdout as two bytes per value; for
// tests/tools/test_fp8_reference.py, which compares them with ml_dtypes.
#include <cstdio>
#include <vector>

#include "util/fp8.hpp"

int main() {
  float x;
  std::vector<unsigned char> out;
  while (std::fread(&x, sizeof x, 1, stdin) == 1) {
    out.push_back(trident::float_to_fp8(x, trident::Fp8Format::E4M3));
    out.push_back(trident::float_to_fp8(x, trident::Fp8Format::E5M2));
  }
  return std::fwrite(out.data(), 1, out.size(), stdout) == out.size() ? 0 : 1;
}
