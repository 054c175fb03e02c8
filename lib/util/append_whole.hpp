#pragma once
// Appending a record to a log file so that the file only ever holds whole records.
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <string>

namespace trident {

// Appends `bytes` to the O_APPEND file `fd`. On failure (a full disk, a file-size limit) the
// part already written is cut off again, so a reader never meets half a record, and the
// errno of the failure is returned (ENOSPC for a write that wrote nothing); 0 on success.
inline int append_whole(int fd, const std::string& bytes) {
  struct stat st {};
  const bool sized = ::fstat(fd, &st) == 0;
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = n < 0 ? errno : ENOSPC;
      if (sized && done > 0) {
        const int ignored = ::ftruncate(fd, st.st_size);
        (void)ignored;
      }
      return err;
    }
    done += static_cast<size_t>(n);
  }
  return 0;
}

}  // namespace trident
