#pragma once
// Internal to lib/checkpoint: agreeing on errors across ranks so that every rank throws the
// same trident::Error (a failure seen by only some ranks must never leave the others waiting in
// a collective).
#include <mpi.h>

#include <cstdint>
#include <string>

#include "util/error.hpp"

namespace trident::ckpt {

inline int comm_rank(MPI_Comm c) {
  int r = 0;
  MPI_Comm_rank(c, &r);
  return r;
}

inline int comm_size(MPI_Comm c) {
  int s = 1;
  MPI_Comm_size(c, &s);
  return s;
}

// Collective: root's string on every rank (messages, the file index, a temp name: small).
inline std::string bcast_string(MPI_Comm comm, std::string s, int root) {
  int64_t n = static_cast<int64_t>(s.size());
  MPI_Bcast(&n, 1, MPI_INT64_T, root, comm);
  s.resize(static_cast<size_t>(n));
  MPI_Bcast(s.data(), static_cast<int>(n), MPI_CHAR, root, comm);
  return s;
}

// Collective: "" if no rank has an error, else the lowest failing rank's message, on every
// rank. One all-reduce when nobody failed.
inline std::string agree(MPI_Comm comm, const std::string& local_error) {
  const int size = comm_size(comm);
  int mine = local_error.empty() ? size : comm_rank(comm), first = size;
  MPI_Allreduce(&mine, &first, 1, MPI_INT, MPI_MIN, comm);
  if (first == size) return "";
  return bcast_string(comm, local_error, first);
}

inline void agree_or_throw(MPI_Comm comm, const std::string& local_error) {
  std::string e = agree(comm, local_error);
  if (!e.empty()) throw Error(e);
}

}  // namespace trident::ckpt
