#pragma once
// Packed documents (data.document_mask): a sequence of T tokens cut from a stream of documents,
// each ended by the end-of-document token `eod`, holds pieces of several documents. Per row, the
// first row of its document inside the sequence: attention lets row t see the rows
// [start[t], t], and with model.position_reset row t is at position t - start[t].
//
// The end-of-document token belongs to the document it ends (Megatron-LM's
// get_ltor_masks_and_position_ids, torchtitan's document mask): the row after it starts a new
// document. A sequence that begins inside a document starts it at row 0.
#include <cstdint>

namespace trident {

// start[b*T + t] for the B sequences of T tokens in tokens[B*T] (host memory): non-decreasing
// in t within a sequence, start[t] <= t, and start[0] = 0.
void document_starts(int32_t* start, const int32_t* tokens, int64_t B, int64_t T, int32_t eod);

// position[n] = (n mod T) - start[n]: each row's position inside its document.
void document_positions(int32_t* position, const int32_t* start, int64_t B, int64_t T);

}  // namespace trident
