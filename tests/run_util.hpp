#pragma once
// Runs a command (the trident binary, mpiexec, a tool) under a hard timeout and captures its
// combined output and exit code, for tests that check a whole program's behaviour.
#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <sys/wait.h>
#include <unistd.h>

namespace trident::test {

struct RunResult {
  int exit_code = -1;   // exit status; 128+signal if killed by a signal; 124 on timeout
  std::string output;   // stdout and stderr together
};

// merge_stderr = false: `output` is stdout alone (stderr goes to the test's own stderr).
inline RunResult run_command(const std::string& command, int timeout_s = 120,
                             bool merge_stderr = true) {
  std::string quoted;  // the command inside single quotes for bash -c
  for (char c : command) quoted += (c == '\'') ? std::string("'\\''") : std::string(1, c);
  std::string full = "timeout -k 5 " + std::to_string(timeout_s) + " bash -c '" + quoted + "'" +
                     (merge_stderr ? " 2>&1" : "");
  RunResult r;
  FILE* pipe = popen(full.c_str(), "r");
  if (!pipe) return r;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), pipe)) > 0) r.output.append(buf.data(), n);
  int status = pclose(pipe);
  if (WIFEXITED(status)) r.exit_code = WEXITSTATUS(status);
  else if (WIFSIGNALED(status)) r.exit_code = 128 + WTERMSIG(status);
  return r;
}

// A fresh, empty directory under the build tree for one test's files.
inline std::filesystem::path scratch_dir(const std::string& name) {
  auto dir = std::filesystem::temp_directory_path() / ("trident_test_" + name + "_" +
                                                       std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

inline void write_file(const std::filesystem::path& path, const std::string& text) {
  std::ofstream(path) << text;
}

inline std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace trident::test
