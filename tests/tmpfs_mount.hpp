#pragma once
// A tmpfs mounted for the scope of a test (a full disk, a read-only file system), when the test
// runs as root and may mount; mounted() says whether it is. Tests fall back on what a normal
// user can do (a file-size limit, permission bits) when it is not.
#include <unistd.h>

#include <filesystem>
#include <string>

#include "run_util.hpp"

namespace trident::test {

class TmpfsMount {
 public:
  // `options`: mount -o, e.g. "size=4k" or "size=64k,ro".
  TmpfsMount(const std::filesystem::path& dir, const std::string& options) : dir_(dir) {
    std::filesystem::create_directories(dir_);
    if (::geteuid() != 0) return;
    mounted_ = run_command("mount -t tmpfs -o " + options + " tmpfs " + dir_.string(), 20)
                   .exit_code == 0;
  }
  ~TmpfsMount() {
    if (mounted_) run_command("umount " + dir_.string(), 20);
  }
  TmpfsMount(const TmpfsMount&) = delete;
  TmpfsMount& operator=(const TmpfsMount&) = delete;
  bool mounted() const { return mounted_; }
  const std::filesystem::path& dir() const { return dir_; }

 private:
  std::filesystem::path dir_;
  bool mounted_ = false;
};

}  // namespace trident::test
