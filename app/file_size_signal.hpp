#pragma once
// SIGXFSZ, the signal of a write beyond the file-size limit (ulimit -f, RLIMIT_FSIZE), whose
// default action ends the process without a word. MPI's start-up writes shared-memory files of
// several MB (UCX's receive pools: 4.3 MB here), so a smaller limit ended every run inside
// MPI_Init, silently.
namespace trident {

// Before MPI_Init: a SIGXFSZ from here on ends the process with one line naming the limit and
// exit code 1 (written from the handler, async-signal-safe; nothing else can be done then, the
// MPI library would fail in many lines).
void fail_on_file_size_signal();

// After MPI_Init: SIGXFSZ is ignored, so that a write beyond the limit fails with EFBIG and the
// code that wrote reports it in its own error line, naming its file.
void ignore_file_size_signal();

}  // namespace trident
