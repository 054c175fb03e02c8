#pragma once
// Checkpoint directory: atomic commit, the `latest` pointer, retention.
//
//   CKPT_DIR/step_00000100.h5                    complete checkpoints (only ever renamed into place)
//   CKPT_DIR/step_00000100.h5.tmp-<pid>-<hex>    a write in progress, or one that was killed
//   CKPT_DIR/latest                              "step_00000100.h5\n": the newest committed one
//
// Commit (write_checkpoint): every rank writes the temp file; close (collective); every rank
// fsyncs it; rank 0 renames it to its final name, fsyncs the directory, writes latest.tmp,
// fsyncs it, renames it to `latest`, fsyncs the directory; the outcome is broadcast. A crash at
// any point leaves either the old state or the new one, never a half-written step_*.h5 or a
// `latest` naming one. On failure the temp file is removed and `latest` is untouched.
// docs/checkpoint-format.md, "Commit protocol".
#include <mpi.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "checkpoint/h5_file.hpp"

namespace trident {

// "step_00000100.h5" (at least 8 digits). Throws on a negative step.
std::string checkpoint_name(int64_t step);
// The step of a complete checkpoint's file name ("step_<digits>.h5"); nullopt for anything
// else (temp files, `latest`, other files).
std::optional<int64_t> checkpoint_step(const std::string& file_name);

struct CheckpointEntry {
  int64_t step = 0;
  std::string path;  // dir + "/" + file name
};
// The complete checkpoints in `dir` (regular files named like checkpoint_name), by increasing
// step. Empty if `dir` does not exist.
std::vector<CheckpointEntry> list_checkpoints(const std::string& dir);

// The path of the checkpoint to resume from: the file `latest` names if it exists (and is a
// checkpoint name), else the newest complete checkpoint, else nullopt. Never a temp file.
std::optional<std::string> latest_checkpoint(const std::string& dir);

// Deletes complete checkpoints except the newest `keep` (by step), those whose file name or
// path is in `protect`, and the one `latest` names. Never touches temp files or other files.
// Returns the deleted paths. Not collective (call it on one rank). Throws on a failed delete.
std::vector<std::string> prune_checkpoints(const std::string& dir, int64_t keep,
                                           const std::vector<std::string>& protect = {});

// Temporary files of writes that did not finish (`step_<digits>.h5.tmp-*`, regular files) in
// `dir`: those last modified before the newest committed checkpoint (latest_checkpoint) are
// the remains of killed writes and are deleted; the others are kept (a write that may still
// be in progress, of another run sharing the directory). Not collective: call it on one rank,
// before training. Touches nothing else; a failed delete is kept and listed with its error.
struct TempFileCleanup {
  std::vector<std::string> removed, kept;  // file names, sorted
  std::string newest;                      // the committed checkpoint compared with ("": none)
  // One line for the log ("" when there was no temp file): what was removed and kept, naming
  // the directory and up to three files of each.
  std::string describe(const std::string& dir) const;
};
TempFileCleanup clean_temp_files(const std::string& dir);

// fsync of a file or directory (opened read-only: enough for fsync on Linux), as the commit
// syncs a checkpoint; trident::Error "<what> '<path>': ..." on failure.
void fsync_path(const std::string& path, const std::string& what);

// Rank-0 part of the commit (exposed for tests and tools): fsyncs `tmp_path`, renames it to
// dir/checkpoint_name(step), fsyncs `dir`, points `latest` at it (latest.tmp, fsync, rename,
// fsync dir). Returns the final path. Throws trident::Error naming the file on failure; if
// `latest` could not be updated, the renamed file is deleted again (unless it replaced an
// existing file of the same name), so the directory is as before.
std::string publish_checkpoint(const std::string& tmp_path, const std::string& dir,
                               int64_t step);

// Collective over comm: writes checkpoint `step` into `dir` atomically. Creates `dir` if
// needed (throws naming it if that fails or it is not writable), opens a writer on a temp file
// and calls fill(writer) on every rank (fill writes the datasets and attributes), then commits
// as above. Any trident::Error (from fill, the writer or the commit) is rethrown on every rank
// after the temp file was removed; `latest` is then untouched. fill must throw on all ranks or
// none (everything CheckpointWriter throws is). Returns the final path.
std::string write_checkpoint(const std::string& dir, int64_t step, MPI_Comm comm,
                             const std::function<void(CheckpointWriter&)>& fill,
                             const WriterOptions& options = {});

}  // namespace trident
