#pragma once
// One checkpoint = one parallel HDF5 file. Every tensor is ONE float32 dataset with its GLOBAL
// shape (layout-free); each rank writes and reads exactly the pieces it holds, described as
// runs over the dataset's global row-major flat index space (checkpoint/ckpt_runs.hpp).
// docs/checkpoint-format.md specifies the file; checkpoint/commit.hpp makes a write atomic.
//
// Collectives: every method marked "collective" must be called by every rank of the
// communicator, in the same order, with the same name/shape/attribute arguments (runs and
// buffers differ per rank; a rank with nothing to do passes no runs). Errors are
// trident::Errors of one line naming the file and the dataset or attribute, and are thrown on
// EVERY rank of the communicator, so a failure never leaves ranks hanging in a collective:
// argument errors every rank sees alike (a missing dataset, a shape mismatch, a dataset
// written twice) are thrown at once; failures only some ranks may see (a bad run, an I/O
// error, a full disk) are agreed on, the message being the lowest failing rank's. Tensor data
// move with independent MPI-IO transfers by default, so write_tensor and read_tensor exchange
// no messages at all: their agreement, with the checksums of every tensor, is one pair of
// all-reduces in CheckpointWriter::close() and CheckpointReader::finish()/close().
// Non-collective methods (shape, datasets, attributes on the reader) answer from an index that
// rank 0 read and broadcast at open, so they give the same answer on every rank.
//
// Integrity: every dataset carries a uint64 attribute "checksum" (ckpt_runs.hpp); reads verify
// it when the ranks together count every element exactly once (see ChecksumShare), and a
// dataset without one (or with one of another type) is an error. A group's attributes can be
// sealed likewise (seal_attributes: a uint64 "attributes_checksum" over all of them), and
// reads can require values to be finite (ReaderOptions::value_check).
#include <mpi.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "checkpoint/ckpt_runs.hpp"

namespace trident {

// A scalar attribute as stored: integer (signed or not), floating point, string, or other
// (an HDF5 type Trident does not read; `text` describes it).
struct AttributeValue {
  enum class Kind { Int, Uint, Double, String, Other };
  Kind kind = Kind::Other;
  int64_t i = 0;
  uint64_t u = 0;
  double d = 0;
  std::string text;  // String: the value; Other: a description of the type
};

// The attribute seal_attributes() writes, and its value: FNV-1a (64 bit) over, for each
// attribute but this one in byte order of the names, `name NUL kind NUL value NUL`, kind
// being i (Int), u (Uint), f (Double) or s (String) and value the decimal integer, the double
// as printf "%.17g", or the string's bytes (docs/checkpoint-format.md). Throws for an
// attribute of kind Other (Trident never writes one).
inline constexpr const char* kAttributesChecksumKey = "attributes_checksum";
uint64_t attributes_checksum(const std::map<std::string, AttributeValue>& attributes);

// File-creation tuning (docs/checkpoint-format.md, "Performance"). MPI-IO hints can also
// come from the ROMIO_HINTS file as usual.
struct WriterOptions {
  bool overwrite = false;                // false: the file must not exist yet
  int64_t align_threshold = 1 << 20;     // objects >= this many bytes start at a multiple of
  int64_t alignment = 1 << 20;           //   `alignment` (H5Pset_alignment); 0: no alignment
  // H5Pset_meta_block_size; 0: HDF5's 2 KiB. Larger blocks keep metadata together but cost
  // a whole block of disk as soon as a string attribute exists (the global heap is written
  // out with the block), and measured no faster here.
  int64_t meta_block_size = 0;
  bool collective_metadata_write = true; // H5Pset_coll_metadata_write
  // Tensor data transfers: false = independent (H5FD_MPIO_INDEPENDENT), true = collective
  // (MPI-IO collective buffering: may pay off for many small strided pieces, e.g. column
  // splits, on a parallel file system; costs two all-reduces per tensor).
  bool collective_data = false;
  // MPI_Info for MPI_File_open, after romio_cb_write=enable (which makes ROMIO agree on
  // errors in collective writes; overriding it risks hangs on a full disk).
  std::vector<std::pair<std::string, std::string>> mpi_hints;
};

class CheckpointWriter {
 public:
  // Collective. Creates `path` with the MPI-IO driver. Throws (on every rank) naming the file
  // if it cannot be created (missing or unwritable directory), or if it exists and
  // !options.overwrite.
  CheckpointWriter(const std::string& path, MPI_Comm comm, const WriterOptions& options = {});
  // If close() was not called (an error, or an exception elsewhere): abandons the file, i.e.
  // empties it (rank 0) and closes it (collectively, with nothing written that can fail on a
  // full disk; errors ignored); the caller deletes it.
  // Every rank must destroy the writer, which holds when every error came from this class
  // (they are thrown on all ranks).
  ~CheckpointWriter();
  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;

  // Collective. Creates float32 dataset `name` ("/model/h/003/mlp/fc/weight": absolute, groups
  // created as needed) of `global_shape` (rank 1..32) and writes this rank's `runs` from
  // `local` (runs of one rank must not overlap in the dataset). The ranks' runs together must
  // cover every element exactly once (checked at close(): the total count must equal the
  // element count). Its "checksum" attribute is written at close(). `local` may be reused as
  // soon as this returns.
  void write_tensor(const std::string& name, const std::vector<int64_t>& global_shape,
                    const std::vector<Run>& runs, std::span<const float> local);
  // The same dataset written in `passes` collective rounds, so that no rank needs its whole
  // part in memory at once (import of foreign checkpoints: bounded chunks). In round p every
  // rank calls piece(p) (the same number of rounds on every rank) for its runs of that round
  // and the buffer they index; the buffer may be reused once piece is called again. The runs
  // of all rounds and ranks together must cover every element exactly once (the count is
  // checked at close(), as for write_tensor).
  struct TensorPiece {
    std::vector<Run> runs;
    std::span<const float> local;
  };
  void write_tensor_in_passes(const std::string& name, const std::vector<int64_t>& global_shape,
                              int64_t passes, const std::function<TensorPiece(int64_t)>& piece);

  // Collective. Scalar attribute `key` on `object` ("/" for the root; a group or dataset path;
  // a missing path is created as a group). Replaces an existing attribute of that name.
  // Strings: variable-length UTF-8. Written at the next agreement (close(); with
  // collective_data the next write_tensor), in the order set, with rank 0's values (one
  // broadcast for all), so the ranks can never disagree.
  void set_attribute(const std::string& object, const std::string& key, int64_t value);
  void set_attribute(const std::string& object, const std::string& key, double value);
  void set_attribute(const std::string& object, const std::string& key, const std::string& value);
  void set_attribute(const std::string& object, const std::string& key, const char* value) {
    set_attribute(object, key, std::string(value));
  }
  template <class T>
    requires(std::is_integral_v<T> && !std::is_same_v<T, bool> && !std::is_same_v<T, int64_t>)
  void set_attribute(const std::string& object, const std::string& key, T value) {
    set_attribute(object, key, static_cast<int64_t>(value));
  }
  // Collective. At close(), after every attribute is written, stores the uint64 attribute
  // kAttributesChecksumKey on `object` (a group; "/" for the root): attributes_checksum() of
  // the attributes set on it through this writer (which must be all it has).
  // CheckpointReader::verify_attributes checks it.
  void seal_attributes(const std::string& object);

  // Collective. Agrees on every write_tensor (errors, element counts, same names and shapes on
  // all ranks), writes the checksums, flushes and closes the file; throws on every rank if
  // anything failed anywhere (the file is then abandoned as by the destructor).
  void close();

  const std::string& path() const { return path_; }
  // Bytes of tensor data in the file so far (global, the same on every rank).
  int64_t data_bytes() const { return data_bytes_; }

 private:
  void abandon();
  std::string reserve_metadata_room();
  void finish_pending();
  void queue_attribute(const std::string& object, const std::string& key, AttributeValue value);
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::string path_;
  int64_t data_bytes_ = 0;
};

// Which of the elements a rank reads it counts toward the dataset's checksum check. The
// check runs when the ranks' counted elements add up to the dataset's element count (each
// element must be counted by exactly one rank; e.g. a tensor every rank reads whole: all() on
// one rank, none() on the others), is skipped when no rank counts anything, and is an error
// otherwise (it would be meaningless).
class ChecksumShare {
 public:
  static ChecksumShare all() { return ChecksumShare(Kind::All, {}); }   // every element read
  static ChecksumShare none() { return ChecksumShare(Kind::None, {}); }
  // These runs (local positions as in the read runs; a subset of what is read).
  static ChecksumShare only(std::vector<Run> runs) {
    return ChecksumShare(Kind::Only, std::move(runs));
  }
  enum class Kind { All, None, Only };
  Kind kind() const { return kind_; }
  const std::vector<Run>& runs() const { return runs_; }

 private:
  ChecksumShare(Kind k, std::vector<Run> r) : kind_(k), runs_(std::move(r)) {}
  Kind kind_;
  std::vector<Run> runs_;
};

struct ReaderOptions {
  bool collective_data = false;  // as WriterOptions::collective_data
  // What the values of a dataset must satisfy (by its path; empty: ValueCheck::Any for all).
  // read_tensor checks every element it reads (agreed on at finish(), after the checksums),
  // verify every element: "checkpoint 'F': dataset '/x' holds nan at element 12".
  std::function<ValueCheck(const std::string& dataset)> value_check;
};

class CheckpointReader {
 public:
  // Collective. Opens `path` read-only. Throws (on every rank) naming the file if it is
  // missing, not a regular file, not HDF5, truncated or otherwise unreadable.
  CheckpointReader(const std::string& path, MPI_Comm comm, const ReaderOptions& options = {});
  ~CheckpointReader();  // closes collectively if close() was not called
  CheckpointReader(const CheckpointReader&) = delete;
  CheckpointReader& operator=(const CheckpointReader&) = delete;

  const std::string& path() const { return path_; }

  // ---- local (the index; same answer on every rank) ----
  bool has_dataset(const std::string& name) const;
  // Throws "checkpoint 'F': no dataset '/x'" if missing.
  std::vector<int64_t> shape(const std::string& name) const;
  // Every dataset path ("/a/b"), sorted.
  std::vector<std::string> datasets() const;
  // "float32", "int64", ... of a dataset (throws like shape()).
  std::string dtype(const std::string& name) const;
  // The dataset's "checksum" attribute; throws naming the dataset if it has none or one that
  // is not a uint64: "checkpoint 'F': dataset '/x' has no 'checksum' attribute".
  uint64_t checksum(const std::string& name) const;
  bool has_attribute(const std::string& object, const std::string& key) const;
  // Attribute keys of `object` ("/", a group or a dataset), sorted; throws if no such object.
  std::vector<std::string> attributes(const std::string& object) const;
  // Checks the kAttributesChecksumKey attribute of `object` (seal_attributes) against its
  // other attributes; throws naming the file and object if it is missing, mistyped or wrong:
  // "checkpoint 'F': the attributes of '/' are corrupt (attributes_checksum mismatch)".
  void verify_attributes(const std::string& object) const;
  // Throw naming file, object and key when missing or of another type (int: any integer that
  // fits int64; double: any floating point or integer; string: any string).
  int64_t attribute_int(const std::string& object, const std::string& key) const;
  double attribute_double(const std::string& object, const std::string& key) const;
  std::string attribute_string(const std::string& object, const std::string& key) const;
  const AttributeValue& attribute(const std::string& object, const std::string& key) const;

  // ---- collective ----
  // Reads this rank's `runs` of dataset `name` into `local`, after checking the dataset exists,
  // has `expected_shape` and a uint64 "checksum" attribute (else throws at once, naming the
  // dataset and what is wrong).
  // Runs of one rank must not overlap (in the dataset or in `local`); runs of different ranks
  // may. Communicates nothing with independent transfers (the default): failures some ranks
  // see (a bad run, an I/O error) and the checksum check (as `share` says) come at finish().
  void read_tensor(const std::string& name, const std::vector<int64_t>& expected_shape,
                   const std::vector<Run>& runs, std::span<float> local,
                   const ChecksumShare& share = ChecksumShare::all());
  // Checks every read_tensor since the last finish(), in one agreement: throws on every rank
  // the first failure, e.g. "checkpoint 'F': dataset '/x' is corrupt (checksum mismatch)".
  // What read_tensor read is trustworthy only once finish() (or close()) returned.
  void finish();
  // Reads the whole dataset, split over the ranks in pieces of at most `chunk_elements` per
  // rank per read, and checks its checksum (an error if it has none) and its values
  // (options.value_check) at once. verify_all: every dataset, in datasets() order.
  void verify(const std::string& name, int64_t chunk_elements = int64_t{1} << 24);
  void verify_all(int64_t chunk_elements = int64_t{1} << 24);

  // Collective: finish(), then closes the file (throwing what finish() threw, after closing).
  void close();

 private:
  struct Object {
    bool is_dataset = false;
    std::vector<int64_t> shape;
    std::string dtype;  // "float32", ...; datasets only
    std::map<std::string, AttributeValue> attributes;
  };
  const Object& dataset_entry(const std::string& name) const;
  const Object& object_entry(const std::string& name) const;

  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::string path_;
  std::map<std::string, Object> index_;
};

// Normalizes an HDF5 object path: leading '/' added, repeated and trailing '/' removed.
std::string h5_path(const std::string& name);

}  // namespace trident
