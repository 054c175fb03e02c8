#include "util/input_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "util/error.hpp"

namespace trident {
namespace {

const char* kind_of(mode_t mode) {
  return S_ISDIR(mode)    ? "a directory"
         : S_ISFIFO(mode) ? "a FIFO"
         : S_ISCHR(mode)  ? "a character device"
         : S_ISBLK(mode)  ? "a block device"
         : S_ISSOCK(mode) ? "a socket"
                          : "not a file";
}

std::string mib_text(int64_t bytes) {
  return bytes % (int64_t{1} << 20) == 0 ? std::to_string(bytes >> 20) + " MiB"
                                         : std::to_string(bytes) + " bytes";
}

}  // namespace

std::string read_input_file(const std::string& path, const InputFile& file) {
  auto fail = [&](const std::string& what) { throw Error(file.shown + ": " + what); };
  auto not_regular = [&](mode_t mode) {
    fail(std::string("not a regular file (") + kind_of(mode) + "): " + file.needs);
  };
  auto too_large = [&](int64_t size) {
    fail(file.kind + " file is " + std::to_string(size) + " bytes, more than the " +
         mib_text(file.max_bytes) + " a " + file.kind + " may have: " + file.needs);
  };
  // stat before opening; O_NONBLOCK covers a FIFO put in the file's place in between.
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0)
    fail(std::string("cannot open file: ") + std::strerror(errno));
  if (!S_ISREG(st.st_mode)) not_regular(st.st_mode);
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) fail(std::string("cannot open file: ") + std::strerror(errno));
  std::string text, error;
  bool regular = true, large = false;
  if (::fstat(fd, &st) != 0) error = std::string("cannot stat file: ") + std::strerror(errno);
  else if (!S_ISREG(st.st_mode)) regular = false;
  else if (st.st_size > file.max_bytes) large = true;
  char buf[1 << 16];
  while (error.empty() && regular && !large) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) error = std::string("cannot read file: ") + std::strerror(errno);
    if (n <= 0) break;
    text.append(buf, static_cast<size_t>(n));
    large = static_cast<int64_t>(text.size()) > file.max_bytes;  // it grew
  }
  ::close(fd);
  if (!regular) not_regular(st.st_mode);
  if (large) too_large(std::max<int64_t>(st.st_size, static_cast<int64_t>(text.size())));
  if (!error.empty()) fail(error);
  return text;
}

}  // namespace trident
