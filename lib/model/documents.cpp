#include "model/documents.hpp"

namespace trident {

void document_starts(int32_t* start, const int32_t* tokens, int64_t B, int64_t T, int32_t eod) {
  for (int64_t b = 0; b < B; ++b) {
    int32_t first = 0;
    for (int64_t t = 0; t < T; ++t) {
      start[b * T + t] = first;
      if (tokens[b * T + t] == eod) first = static_cast<int32_t>(t + 1);
    }
  }
}

void document_positions(int32_t* position, const int32_t* start, int64_t B, int64_t T) {
  for (int64_t n = 0; n < B * T; ++n) position[n] = static_cast<int32_t>(n % T) - start[n];
}

}  // namespace trident
