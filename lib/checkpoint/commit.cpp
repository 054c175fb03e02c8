#include "checkpoint/commit.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>
#include <sstream>
#include <thread>

#include "checkpoint/ckpt_mpi.hpp"
#include "util/error.hpp"
#include "util/test_hooks.hpp"

namespace trident {

namespace fs = std::filesystem;

namespace {

const char* kLatest = "latest";
const char* kLatestTmp = "latest.tmp";

std::string join(const std::string& dir, const std::string& name) {
  return (fs::path(dir) / name).string();
}

std::string errno_text() { return std::strerror(errno); }


void rename_path(const std::string& from, const std::string& to) {
  if (std::rename(from.c_str(), to.c_str()) != 0) {
    throw Error("checkpoint '" + from + "': cannot rename to '" + to + "': " + errno_text());
  }
}

std::string random_suffix() {
  std::random_device rd;
  std::ostringstream s;
  s << ::getpid() << '-' << std::hex << ((static_cast<uint64_t>(rd()) << 32) | rd());
  return s.str();
}

}  // namespace

void fsync_path(const std::string& path, const std::string& what) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw Error(what + " '" + path + "': cannot open for fsync: " + errno_text());
  if (::fsync(fd) != 0) {
    const std::string e = errno_text();
    ::close(fd);
    throw Error(what + " '" + path + "': fsync failed: " + e);
  }
  ::close(fd);
}

std::string checkpoint_name(int64_t step) {
  if (step < 0) throw Error("checkpoint step " + std::to_string(step) + " is negative");
  char buf[64];
  std::snprintf(buf, sizeof buf, "step_%08lld.h5", static_cast<long long>(step));
  return buf;
}

std::optional<int64_t> checkpoint_step(const std::string& name) {
  const std::string prefix = "step_", suffix = ".h5";
  if (name.size() <= prefix.size() + suffix.size() || name.compare(0, prefix.size(), prefix) ||
      name.compare(name.size() - suffix.size(), suffix.size(), suffix)) {
    return std::nullopt;
  }
  const std::string digits =
      name.substr(prefix.size(), name.size() - prefix.size() - suffix.size());
  if (digits.size() > 18 ||
      !std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    return std::nullopt;
  }
  return std::stoll(digits);
}

std::vector<CheckpointEntry> list_checkpoints(const std::string& dir) {
  std::vector<CheckpointEntry> out;
  std::error_code ec;
  fs::directory_iterator it(dir, ec), end;
  if (ec) return out;
  for (; it != end; it.increment(ec)) {
    if (ec) break;
    const std::string name = it->path().filename().string();
    const auto step = checkpoint_step(name);
    std::error_code ec2;
    if (step && it->is_regular_file(ec2)) out.push_back({*step, join(dir, name)});
  }
  std::sort(out.begin(), out.end(), [](const CheckpointEntry& a, const CheckpointEntry& b) {
    return a.step != b.step ? a.step < b.step : a.path < b.path;
  });
  return out;
}

std::optional<std::string> latest_checkpoint(const std::string& dir) {
  // Only a regular file is read (a FIFO would block the open, /dev/zero never end); anything
  // else in its place is a pointer that names nothing, as garbage in it is: the newest file wins.
  std::error_code regular_ec;
  const bool regular = fs::is_regular_file(join(dir, kLatest), regular_ec);
  std::string name;
  if (regular) {  // its first line, from at most 4 KiB: a checkpoint's name is far shorter
    std::ifstream in(join(dir, kLatest), std::ios::binary);
    name.resize(4096);
    in.read(name.data(), static_cast<std::streamsize>(name.size()));
    name.resize(static_cast<size_t>(in.gcount()));
    name = name.substr(0, name.find('\n'));
  }
  if (!name.empty()) {
    while (!name.empty() && std::isspace(static_cast<unsigned char>(name.back()))) name.pop_back();
    std::error_code ec;
    if (checkpoint_step(name) && fs::is_regular_file(join(dir, name), ec)) return join(dir, name);
  }
  const auto all = list_checkpoints(dir);
  if (all.empty()) return std::nullopt;
  return all.back().path;
}

std::vector<std::string> prune_checkpoints(const std::string& dir, int64_t keep,
                                           const std::vector<std::string>& protect) {
  if (keep < 0) throw Error("prune_checkpoints: keep must be >= 0, got " + std::to_string(keep));
  std::set<std::string> keep_names;
  for (const std::string& p : protect) keep_names.insert(fs::path(p).filename().string());
  if (auto latest = latest_checkpoint(dir)) {
    keep_names.insert(fs::path(*latest).filename().string());
  }
  const auto all = list_checkpoints(dir);
  std::vector<std::string> removed;
  const size_t n_old = all.size() > static_cast<size_t>(keep) ? all.size() - keep : 0;
  for (size_t i = 0; i < n_old; ++i) {
    if (keep_names.count(fs::path(all[i].path).filename().string())) continue;
    std::error_code ec;
    if (!fs::remove(all[i].path, ec) && ec) {
      throw Error("checkpoint '" + all[i].path + "': cannot delete: " + ec.message());
    }
    removed.push_back(all[i].path);
  }
  return removed;
}

namespace {

bool is_temp_name(const std::string& name) {
  const size_t at = name.find(".h5.tmp-");
  return at != std::string::npos && checkpoint_step(name.substr(0, at + 3)).has_value();
}

// "a, b, c and 2 more"
std::string some_names(const std::vector<std::string>& names) {
  std::string out;
  const size_t shown = std::min<size_t>(names.size(), 3);
  for (size_t i = 0; i < shown; ++i) out += (i ? ", " : "") + names[i];
  if (names.size() > shown) out += " and " + std::to_string(names.size() - shown) + " more";
  return out;
}

}  // namespace

TempFileCleanup clean_temp_files(const std::string& dir) {
  TempFileCleanup out;
  std::error_code ec;
  fs::file_time_type newest_time = fs::file_time_type::min();
  if (const auto latest = latest_checkpoint(dir)) {
    const auto t = fs::last_write_time(*latest, ec);
    if (!ec) {
      out.newest = fs::path(*latest).filename().string();
      newest_time = t;
    }
  }
  std::vector<std::string> temps;
  fs::directory_iterator it(dir, ec), end;
  for (; !ec && it != end; it.increment(ec)) {
    std::error_code ec2;
    const std::string name = it->path().filename().string();
    if (is_temp_name(name) && it->is_regular_file(ec2)) temps.push_back(name);
  }
  std::sort(temps.begin(), temps.end());
  for (const std::string& name : temps) {
    std::error_code ec2;
    const auto t = fs::last_write_time(join(dir, name), ec2);
    const bool stale = !out.newest.empty() && !ec2 && t < newest_time;
    if (stale && fs::remove(join(dir, name), ec2)) {
      out.removed.push_back(name);
    } else {
      out.kept.push_back(stale ? name + " (cannot delete: " + ec2.message() + ")" : name);
    }
  }
  return out;
}

std::string TempFileCleanup::describe(const std::string& dir) const {
  if (removed.empty() && kept.empty()) return "";
  std::string line = "checkpoint directory '" + dir + "':";
  if (!removed.empty())
    line += " removed " + std::to_string(removed.size()) + " temporary file" +
            (removed.size() == 1 ? "" : "s") + " of unfinished writes older than " + newest +
            " (" + some_names(removed) + ")" + (kept.empty() ? "" : ";");
  if (!kept.empty())
    line += " kept " + std::to_string(kept.size()) + " temporary file" +
            (kept.size() == 1 ? "" : "s") +
            (newest.empty() ? " (no committed checkpoint to compare with)"
                            : " not older than " + newest + " (a write in progress?)") +
            ": " + some_names(kept);
  return line;
}

namespace {

// Test hook (the chaos test, docs/reliability.md): TRIDENT_TEST_COMMIT_PAUSE_MS=N makes rank 0
// sleep N ms at each step of the commit below, so that a kill lands inside it.
void test_pause_in_commit() {
  if (const int64_t ms = test_hook_int(TestHook::CommitPauseMs); ms != 0)
    std::this_thread::sleep_for(std::chrono::milliseconds(ms));
}

}  // namespace

std::string publish_checkpoint(const std::string& tmp_path, const std::string& dir,
                               int64_t step) {
  const std::string final_path = join(dir, checkpoint_name(step));
  fsync_path(tmp_path, "checkpoint");
  test_pause_in_commit();  // the temp file complete, not renamed yet
  struct stat st{};
  const bool replaces = ::stat(final_path.c_str(), &st) == 0;  // the same step written again
  rename_path(tmp_path, final_path);
  test_pause_in_commit();  // renamed, `latest` not updated yet
  try {
    fsync_path(dir, "checkpoint directory");
    const std::string latest_tmp = join(dir, kLatestTmp);
    const std::string content = checkpoint_name(step) + "\n";
    const int fd = ::open(latest_tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
      throw Error("checkpoint pointer '" + latest_tmp + "': cannot create: " + errno_text());
    }
    const bool ok = ::write(fd, content.data(), content.size()) ==
                        static_cast<ssize_t>(content.size()) &&
                    ::fsync(fd) == 0;
    const std::string e = errno_text();
    if (::close(fd) != 0 || !ok) {
      ::unlink(latest_tmp.c_str());
      throw Error("checkpoint pointer '" + latest_tmp + "': cannot write: " + e);
    }
    test_pause_in_commit();  // latest.tmp written, not renamed yet
    rename_path(latest_tmp, join(dir, kLatest));
    fsync_path(dir, "checkpoint directory");
  } catch (const Error&) {
    // `latest` still names the previous checkpoint: take the new file away again, so that a
    // failed commit leaves the directory as it was (unless it replaced a file of that name).
    if (!replaces) ::unlink(final_path.c_str());
    throw;
  }
  return final_path;
}

std::string write_checkpoint(const std::string& dir, int64_t step, MPI_Comm comm,
                             const std::function<void(CheckpointWriter&)>& fill,
                             const WriterOptions& options) {
  const bool root = ckpt::comm_rank(comm) == 0;
  // Rank 0 prepares the directory and picks the temp name: 'E' + error or 'T' + temp path.
  std::string msg;
  if (root) {
    std::string err, tmp_path;
    try {
      const std::string name = checkpoint_name(step);
      std::error_code ec;
      fs::create_directories(dir, ec);
      struct stat st{};
      if (ec) {
        err = "checkpoint directory '" + dir + "': cannot create: " + ec.message();
      } else if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
        err = "checkpoint directory '" + dir + "' is not a directory";
      } else if (::access(dir.c_str(), W_OK | X_OK) != 0) {
        err = "checkpoint directory '" + dir + "' is not writable: " + errno_text();
      } else {
        tmp_path = join(dir, name + ".tmp-" + random_suffix());
      }
    } catch (const std::exception& e) {
      err = e.what();
    }
    msg.push_back(err.empty() ? 'T' : 'E');
    msg += err.empty() ? tmp_path : err;
  }
  msg = ckpt::bcast_string(comm, msg, 0);
  if (msg[0] == 'E') throw Error(msg.substr(1));
  const std::string tmp = msg.substr(1);

  try {
    {
      WriterOptions opts = options;
      opts.overwrite = true;  // the temp name is fresh; a leftover of the same name is garbage
      CheckpointWriter writer(tmp, comm, opts);
      fill(writer);
      writer.close();
    }
    // Every rank flushes what its node wrote (a no-op where nothing is dirty), then rank 0
    // publishes; both outcomes agreed on all ranks.
    std::string err;
    try {
      fsync_path(tmp, "checkpoint");
    } catch (const Error& e) {
      err = e.what();
    }
    ckpt::agree_or_throw(comm, err);
    std::string final_path;
    if (root) {
      try {
        final_path = publish_checkpoint(tmp, dir, step);
      } catch (const Error& e) {
        err = e.what();
      }
    }
    ckpt::agree_or_throw(comm, err);
    return ckpt::bcast_string(comm, final_path, 0);
  } catch (...) {
    // The writer is closed (its destructor ran on every rank). The temp file is garbage; if it
    // was already renamed, the final file is complete and stays (only `latest` is unchanged).
    if (root) ::unlink(tmp.c_str());
    throw;
  }
}

}  // namespace trident
