#include "checkpoint/h5_file.hpp"

#include <fcntl.h>
#include <hdf5.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <set>
#include <sstream>
#include <thread>

#include "checkpoint/ckpt_mpi.hpp"
#include "util/error.hpp"
#include "util/test_hooks.hpp"

namespace trident {

using ckpt::agree;
using ckpt::agree_or_throw;
using ckpt::bcast_string;
using ckpt::comm_rank;
using ckpt::comm_size;

// ---------------------------------------------------------------------------------------------
// Helpers: HDF5 handles and errors, cross-rank error agreement, index (de)serialization.
namespace {

void h5_init() {
  // No clean-up of HDF5 at exit(): after a failed H5Fclose (see CheckpointWriter::abandon) the
  // library's exit handler dereferences the half-destroyed file and crashes the process,
  // e.g. in a 1-rank job, where MPI_Abort ends the process through exit(). The library is
  // still shut down at MPI_Finalize (HDF5 hooks MPI_COMM_SELF's deletion), and every file
  // Trident opens is closed before that. Effective only before the library's first use.
  H5dont_atexit();
  H5open();
  // Errors become trident::Errors; HDF5 must not print its stack on its own.
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
}

herr_t collect_error(unsigned, const H5E_error2_t* e, void* data) {
  auto* out = static_cast<std::vector<std::string>*>(data);
  if (e->desc && *e->desc) out->push_back(e->desc);
  return 0;
}

// The innermost (most specific) message of HDF5's error stack, which is then cleared.
std::string h5_detail() {
  std::vector<std::string> msgs;
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_DOWNWARD, collect_error, &msgs);
  H5Eclear2(H5E_DEFAULT);
  if (msgs.empty()) return "HDF5 error";
  // One line (MPI error strings carry newlines).
  std::string out;
  for (char c : msgs.back()) {
    if (c == '\n' || c == '\r' || c == '\t') c = ' ';
    if (c == ' ' && !out.empty() && out.back() == ' ') continue;
    out += c;
  }
  while (!out.empty() && out.back() == ' ') out.pop_back();
  return out;
}

// An HDF5 identifier closed by its destructor.
class Hid {
 public:
  using Closer = herr_t (*)(hid_t);
  Hid() = default;
  Hid(hid_t id, Closer close) : id_(id), close_(close) {}
  Hid(Hid&& o) noexcept : id_(o.id_), close_(o.close_) { o.id_ = -1; }
  Hid& operator=(Hid&& o) noexcept {
    if (this != &o) {
      reset();
      id_ = o.id_;
      close_ = o.close_;
      o.id_ = -1;
    }
    return *this;
  }
  ~Hid() { reset(); }
  hid_t get() const { return id_; }
  bool valid() const { return id_ >= 0; }
  // Forgets the identifier without closing it.
  void release() { id_ = -1; }
  // Closes now; returns the close call's status (0 if there was nothing to close).
  herr_t reset() {
    herr_t rc = 0;
    if (id_ >= 0 && close_) rc = close_(id_);
    id_ = -1;
    return rc;
  }

 private:
  hid_t id_ = -1;
  Closer close_ = nullptr;
};

uint64_t fnv1a(const std::string& name, const std::vector<int64_t>& shape) {
  uint64_t h = 1469598103934665603ull;
  auto add = [&](const void* p, size_t n) {
    const auto* b = static_cast<const unsigned char*>(p);
    for (size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 1099511628211ull;
  };
  add(name.data(), name.size());
  for (int64_t d : shape) add(&d, sizeof d);
  return h;
}

// "rank R: " prefix for messages only one rank sees.
std::string rank_prefix(MPI_Comm comm) {
  return "rank " + std::to_string(comm_rank(comm)) + ": ";
}

// The N-D selection of `boxes` on `space` (none if empty). Returns "" or the HDF5 error.
std::string select_boxes(hid_t space, const std::vector<Box>& boxes) {
  if (boxes.empty()) return H5Sselect_none(space) < 0 ? h5_detail() : "";
  std::vector<hsize_t> start, count;
  for (size_t i = 0; i < boxes.size(); ++i) {
    start.assign(boxes[i].start.begin(), boxes[i].start.end());
    count.assign(boxes[i].count.begin(), boxes[i].count.end());
    // stride NULL = 1, block NULL = 1: a box of count[] elements.
    if (H5Sselect_hyperslab(space, i == 0 ? H5S_SELECT_SET : H5S_SELECT_OR, start.data(),
                            nullptr, count.data(), nullptr) < 0) {
      return h5_detail();
    }
  }
  return "";
}

// Memory runs laid out back to back in global order? Then no staging copy is needed.
bool local_contiguous(const std::vector<Run>& rs) {
  for (size_t i = 1; i < rs.size(); ++i) {
    if (rs[i].local_offset != rs[i - 1].local_offset + rs[i - 1].length) return false;
  }
  return true;
}

std::string dtype_name(hid_t type) {
  const H5T_class_t cls = H5Tget_class(type);
  const size_t bits = H5Tget_size(type) * 8;
  if (cls == H5T_FLOAT) return "float" + std::to_string(bits);
  if (cls == H5T_INTEGER) {
    return (H5Tget_sign(type) == H5T_SGN_NONE ? "uint" : "int") + std::to_string(bits);
  }
  if (cls == H5T_STRING) return "string";
  return "type class " + std::to_string(static_cast<int>(cls));
}

// ---- index serialization (rank 0 reads the index, the others receive it) ----
struct Out {
  std::string buf;
  void u64(uint64_t v) { buf.append(reinterpret_cast<const char*>(&v), sizeof v); }
  void str(const std::string& s) {
    u64(s.size());
    buf += s;
  }
};
struct In {
  const std::string& buf;
  size_t pos = 0;
  uint64_t u64() {
    uint64_t v = 0;
    std::memcpy(&v, buf.data() + pos, sizeof v);
    pos += sizeof v;
    return v;
  }
  std::string str() {
    const size_t n = u64();
    std::string s = buf.substr(pos, n);
    pos += n;
    return s;
  }
};

const char* kChecksumKey = "checksum";

// Allocates the first `bytes` of the file at `path` on disk (extending its size to them), so
// that no write below fails for space or the file-size limit. Returns 0 or the errno
// (EOPNOTSUPP: the file system cannot).
int reserve_file(const std::string& path, int64_t bytes) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0) return errno;
  int err = 0;
  if (bytes > 0 && ::fallocate(fd, 0, 0, static_cast<off_t>(bytes)) != 0) err = errno;
  ::close(fd);
  return err;
}

// Points every descriptor of this process open on the file `opened` (device and inode) at
// /dev/null, where writes cannot fail and reads find nothing. HDF5's MPI-IO driver gives no
// access to its descriptors, /proc/self/fd lists them.
void divert_to_null(const struct stat& opened) {
  if (opened.st_ino == 0) return;
  const int null_fd = ::open("/dev/null", O_RDWR | O_CLOEXEC);
  if (null_fd < 0) return;
  std::error_code ec;
  for (std::filesystem::directory_iterator it("/proc/self/fd", ec), end; !ec && it != end;
       it.increment(ec)) {
    const int fd = std::atoi(it->path().filename().c_str());
    struct stat st {};
    if (fd != null_fd && ::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) &&
        st.st_dev == opened.st_dev && st.st_ino == opened.st_ino) {
      (void)::dup2(null_fd, fd);
    }
  }
  ::close(null_fd);
}

}  // namespace

uint64_t attributes_checksum(const std::map<std::string, AttributeValue>& attributes) {
  uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a 64: offset basis; prime 0x100000001b3
  auto add = [&](const std::string& bytes) {
    for (unsigned char b : bytes) h = (h ^ b) * 1099511628211ull;
    h = (h ^ 0u) * 1099511628211ull;  // the NUL after each field
  };
  for (const auto& [key, v] : attributes) {  // std::map: byte order of the names
    if (key == kAttributesChecksumKey) continue;
    std::string kind, text;
    switch (v.kind) {
      case AttributeValue::Kind::Int: kind = "i"; text = std::to_string(v.i); break;
      case AttributeValue::Kind::Uint: kind = "u"; text = std::to_string(v.u); break;
      case AttributeValue::Kind::Double: {
        char buf[64];
        std::snprintf(buf, sizeof buf, "%.17g", v.d);
        kind = "f";
        text = buf;
        break;
      }
      case AttributeValue::Kind::String: kind = "s"; text = v.text; break;
      case AttributeValue::Kind::Other:
        throw Error("attribute '" + key + "' is of a type Trident does not read (" + v.text + ")");
    }
    add(key);
    add(kind);
    add(text);
  }
  return h;
}

std::string h5_path(const std::string& name) {
  std::string out;
  std::string part;
  std::istringstream in(name);
  while (std::getline(in, part, '/')) {
    if (!part.empty()) out += "/" + part;
  }
  return out.empty() ? "/" : out;
}

// ---------------------------------------------------------------------------------------------
// Writer

struct CheckpointWriter::Impl {
  MPI_Comm comm = MPI_COMM_NULL;
  Hid file, dxpl, lcpl, dcpl;
  bool collective = false;  // collective tensor transfers
  std::vector<float> staging;
  std::set<std::string> written;
  // Datasets written since the last agreement: this rank's part of each, and its first error.
  struct Pending {
    std::string name;
    int64_t numel;
    uint64_t hash, sum, count;
  };
  std::vector<Pending> pending;
  std::string error;
  // Attributes set since the last agreement (written then, with rank 0's values).
  struct PendingAttribute {
    std::string object, key;
    AttributeValue value;
  };
  std::vector<PendingAttribute> attributes;
  // Every attribute written so far, by object (rank 0's values), and the objects to seal.
  std::map<std::string, std::map<std::string, AttributeValue>> written_attributes;
  std::vector<std::string> sealed;
  int slow_ms = 0;
  bool closed = false;
  // The file as this rank opened it (device, inode), to find HDF5's descriptors of it.
  struct stat opened {};
  // For the room the file needs (room()): the end of the datasets' storage, the objects
  // written and the bytes of attribute values.
  int64_t data_end = 0, objects = 0, attribute_bytes = 0;
  // An upper bound of the file's size once closed (HDF5 1.10 tells the end of allocated space
  // of a file only with a SWMR driver): the datasets' storage (contiguous, allocated at
  // creation), then the metadata allocated after the last of them: the checksum attributes,
  // the attribute values, continuation blocks (measured: 6 KB after 156 datasets; allowed:
  // 64 KiB + 512 bytes a dataset + twice the attribute bytes).
  int64_t room() const {
    return data_end + (int64_t{64} << 10) + 512 * objects + 2 * attribute_bytes;
  }
  // TRIDENT_TEST_CHECKPOINT_FILE_LIMIT: the file-size limit in force from creation to the end
  // of close() or abandon(), and the one it replaced.
  bool limited = false;
  struct rlimit saved_limit {};
  void restore_file_limit() {
    if (limited) setrlimit(RLIMIT_FSIZE, &saved_limit);
    limited = false;
  }
};

CheckpointWriter::CheckpointWriter(const std::string& path, MPI_Comm comm,
                                   const WriterOptions& options)
    : impl_(std::make_unique<Impl>()), path_(path) {
  h5_init();
  Impl& m = *impl_;
  MPI_Comm_dup(comm, &m.comm);
  const std::string where = "checkpoint '" + path + "'";

  // Checks on rank 0 that give a clearer message than HDF5's.
  std::string err;
  if (comm_rank(m.comm) == 0) {
    const size_t slash = path.find_last_of('/');
    const std::string dir = slash == std::string::npos ? "." : path.substr(0, slash + 1);
    struct stat st{};
    if (stat(dir.c_str(), &st) != 0) {
      err = where + ": directory '" + dir + "': " + std::strerror(errno);
    } else if (!S_ISDIR(st.st_mode)) {
      err = where + ": '" + dir + "' is not a directory";
    } else if (access(dir.c_str(), W_OK | X_OK) != 0) {
      err = where + ": directory '" + dir + "' is not writable: " + std::strerror(errno);
    } else if (!options.overwrite && stat(path.c_str(), &st) == 0) {
      err = where + ": already exists";
    }
  }
  err = agree(m.comm, err);
  if (!err.empty()) {
    MPI_Comm_free(&m.comm);
    throw Error(err);
  }

  Hid fapl(H5Pcreate(H5P_FILE_ACCESS), H5Pclose);
  // Collective MPI-IO writes (metadata at flush, tensor data with collective_data) with
  // collective buffering forced on: ROMIO then agrees on errors across ranks, without it an I/O
  // error on some ranks only (a full disk) leaves HDF5 1.10 hanging in a collective.
  MPI_Info info = MPI_INFO_NULL;
  MPI_Info_create(&info);
  MPI_Info_set(info, "romio_cb_write", "enable");
  for (const auto& [k, v] : options.mpi_hints) MPI_Info_set(info, k.c_str(), v.c_str());
  bool ok = fapl.valid() && H5Pset_fapl_mpio(fapl.get(), m.comm, info) >= 0;
  if (info != MPI_INFO_NULL) MPI_Info_free(&info);
  if (ok && options.alignment > 0) {
    ok = H5Pset_alignment(fapl.get(), static_cast<hsize_t>(options.align_threshold),
                          static_cast<hsize_t>(options.alignment)) >= 0;
  }
  if (ok && options.meta_block_size > 0) {
    ok = H5Pset_meta_block_size(fapl.get(), static_cast<hsize_t>(options.meta_block_size)) >= 0;
  }
  if (ok) ok = H5Pset_coll_metadata_write(fapl.get(), options.collective_metadata_write) >= 0;
  // The file format of HDF5 1.8 on: its object headers, B-trees and local heaps carry
  // checksums, so a damaged header or attribute message is a read error HDF5 reports; in the
  // 1.6 format (the default) the library read a bit-flipped attribute message and crashed in
  // H5Aiterate2. (The global heap, where variable-length strings live, has none: string
  // attributes are written fixed-length, finish_pending; docs/fuzzing.md.)
  if (ok) ok = H5Pset_libver_bounds(fapl.get(), H5F_LIBVER_V18, H5F_LIBVER_LATEST) >= 0;
  if (ok) {
    m.file = Hid(H5Fcreate(path.c_str(), options.overwrite ? H5F_ACC_TRUNC : H5F_ACC_EXCL,
                           H5P_DEFAULT, fapl.get()),
                 H5Fclose);
    ok = m.file.valid();
  }
  err = ok ? "" : where + ": cannot create: " + h5_detail();
  err = agree(m.comm, err);
  if (!err.empty()) {
    // A file created on some ranks only cannot be closed (H5Fclose is collective): it is left
    // open rather than hanging. MPI-IO's collective open makes that case practically absent.
    m.file.release();
    MPI_Comm_free(&m.comm);
    throw Error(err);
  }

  if (::stat(path.c_str(), &m.opened) != 0) m.opened = {};
  m.collective = options.collective_data;
  m.dxpl = Hid(H5Pcreate(H5P_DATASET_XFER), H5Pclose);
  H5Pset_dxpl_mpio(m.dxpl.get(),
                   options.collective_data ? H5FD_MPIO_COLLECTIVE : H5FD_MPIO_INDEPENDENT);
  m.lcpl = Hid(H5Pcreate(H5P_LINK_CREATE), H5Pclose);
  H5Pset_create_intermediate_group(m.lcpl.get(), 1);
  m.dcpl = Hid(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
  // Contiguous layout (H5Dget_offset works, one extent per tensor); space allocated at
  // creation, as parallel HDF5 requires, and never pre-filled: every element gets written.
  H5Pset_layout(m.dcpl.get(), H5D_CONTIGUOUS);
  H5Pset_alloc_time(m.dcpl.get(), H5D_ALLOC_TIME_EARLY);
  H5Pset_fill_time(m.dcpl.get(), H5D_FILL_TIME_NEVER);

  m.slow_ms = static_cast<int>(test_hook_int(TestHook::SlowCheckpointMs));
  // Test hook: a full disk without a small file system (which needs root to mount). Writes past
  // N bytes fail with EFBIG (SIGXFSZ ignored), the abandoning close included, as on a disk that
  // is full.
  if (!test_hook(TestHook::CheckpointFileLimit).empty()) {
    if (getrlimit(RLIMIT_FSIZE, &m.saved_limit) == 0) {
      std::signal(SIGXFSZ, SIG_IGN);
      struct rlimit small = m.saved_limit;
      small.rlim_cur = static_cast<rlim_t>(
          std::max<int64_t>(0, test_hook_int(TestHook::CheckpointFileLimit)));
      m.limited = setrlimit(RLIMIT_FSIZE, &small) == 0;
    }
  }
}

CheckpointWriter::~CheckpointWriter() {
  if (!impl_) return;
  Impl& m = *impl_;
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) {  // destroyed after MPI_Finalize: nothing collective can be done any more
    m.file.release();
    return;
  }
  if (!m.closed) abandon();
  m.restore_file_limit();
  if (m.comm != MPI_COMM_NULL) MPI_Comm_free(&m.comm);
}

void CheckpointWriter::abandon() {
  Impl& m = *impl_;
  m.closed = true;
  if (!m.file.valid()) return;
  // The file is garbage now, but H5Fclose still writes the dirty metadata, collectively (see
  // reserve_metadata_room()): a write failing there leaves the ranks in different collectives
  // for ever. So rank 0 empties the file, giving back the space its data took, and reserves
  // room for what the close writes; where that is impossible (the file did not fit, a file-
  // size limit, no fallocate) every rank first points its descriptors of the file at
  // /dev/null: the close then has no write that can fail, only its final resize of the file
  // fails, on every rank alike (with HDF5 1.10 a failed H5Fclose leaves a half-destroyed file
  // that crashes the library's clean-up, see h5_init).
  int reserved = 0;
  if (comm_rank(m.comm) == 0) {
    (void)::truncate(path_.c_str(), 0);
    reserved = reserve_file(path_, m.room()) == 0;
  }
  MPI_Bcast(&reserved, 1, MPI_INT, 0, m.comm);
  if (!reserved) divert_to_null(m.opened);
  (void)m.file.reset();  // collective
  H5Eclear2(H5E_DEFAULT);
}

namespace {

// Opens `object` (creating it as a group, with its parents, if the path is missing).
Hid open_or_create_object(hid_t file, hid_t lcpl, const std::string& object,
                          const std::string& where) {
  std::string prefix;
  bool exists = true;
  std::istringstream in(object);
  std::string part;
  while (exists && std::getline(in, part, '/')) {
    if (part.empty()) continue;
    prefix += "/" + part;
    const htri_t e = H5Lexists(file, prefix.c_str(), H5P_DEFAULT);
    if (e < 0) throw Error(where + ": cannot look up '" + prefix + "': " + h5_detail());
    exists = e > 0;
  }
  if (!exists) {
    Hid g(H5Gcreate2(file, object.c_str(), lcpl, H5P_DEFAULT, H5P_DEFAULT), H5Gclose);
    if (!g.valid()) throw Error(where + ": cannot create group: " + h5_detail());
  }
  Hid o(H5Oopen(file, object.c_str(), H5P_DEFAULT), H5Oclose);
  if (!o.valid()) throw Error(where + ": cannot open: " + h5_detail());
  return o;
}

// A UTF-8 string type of `bytes` bytes (at least 1: HDF5 has no empty fixed-length string),
// padded with NULs: h5py reads it as numpy.bytes_ without the padding.
Hid fixed_length_string(size_t bytes) {
  Hid type(H5Tcopy(H5T_C_S1), H5Tclose);
  if (!type.valid() || H5Tset_size(type.get(), std::max<size_t>(bytes, 1)) < 0 ||
      H5Tset_strpad(type.get(), H5T_STR_NULLPAD) < 0 ||
      H5Tset_cset(type.get(), H5T_CSET_UTF8) < 0)
    throw Error("HDF5: cannot make a string type of " + std::to_string(bytes) +
                " bytes: " + h5_detail());
  return type;
}

void write_scalar_attribute(hid_t obj, const std::string& key, hid_t file_type, hid_t mem_type,
                            const void* value, const std::string& where) {
  const htri_t e = H5Aexists(obj, key.c_str());
  if (e > 0 && H5Adelete(obj, key.c_str()) < 0) {
    throw Error(where + ": cannot replace attribute: " + h5_detail());
  }
  Hid space(H5Screate(H5S_SCALAR), H5Sclose);
  Hid attr(H5Acreate2(obj, key.c_str(), file_type, space.get(), H5P_DEFAULT, H5P_DEFAULT),
           H5Aclose);
  if (e < 0 || !attr.valid() || H5Awrite(attr.get(), mem_type, value) < 0) {
    throw Error(where + ": cannot write attribute: " + h5_detail());
  }
  if (attr.reset() < 0) throw Error(where + ": cannot write attribute: " + h5_detail());
}

}  // namespace

void CheckpointWriter::write_tensor(const std::string& name,
                                    const std::vector<int64_t>& shape,
                                    const std::vector<Run>& runs, std::span<const float> local) {
  write_tensor_in_passes(name, shape, 1, [&](int64_t) { return TensorPiece{runs, local}; });
}

void CheckpointWriter::write_tensor_in_passes(const std::string& name_in,
                                              const std::vector<int64_t>& shape, int64_t passes,
                                              const std::function<TensorPiece(int64_t)>& piece) {
  Impl& m = *impl_;
  const std::string name = h5_path(name_in);
  const std::string where = "checkpoint '" + path_ + "': dataset '" + name + "'";
  // Argument checks: the same arguments on every rank, hence the same outcome.
  if (m.closed) throw Error(where + ": the writer is closed");
  if (name == "/") throw Error("checkpoint '" + path_ + "': a dataset cannot be the root group");
  if (shape.empty() || shape.size() > H5S_MAX_RANK) {
    throw Error(where + ": shape " + shape_string(shape) + " must have 1 to 32 dims");
  }
  int64_t numel = 0;
  try {
    numel = shape_numel(shape);
  } catch (const Error& e) {
    throw Error(where + ": " + e.what());
  }
  if (m.written.count(name)) throw Error(where + ": written twice");

  std::string err;
  const std::vector<hsize_t> dims(shape.begin(), shape.end());
  Hid space(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr), H5Sclose);
  Hid dset;
  if (!space.valid()) {
    err = where + ": cannot create dataspace: " + h5_detail();
  } else {
    dset = Hid(H5Dcreate2(m.file.get(), name.c_str(), H5T_IEEE_F32LE, space.get(), m.lcpl.get(),
                          m.dcpl.get(), H5P_DEFAULT),
               H5Dclose);
    if (!dset.valid() && err.empty()) err = where + ": cannot create: " + h5_detail();
  }
  if (dset.valid()) {
    const haddr_t offset = H5Dget_offset(dset.get());  // HADDR_UNDEF: no storage (empty)
    if (offset != HADDR_UNDEF) {
      m.data_end = std::max(m.data_end, static_cast<int64_t>(offset) +
                                            numel * static_cast<int64_t>(sizeof(float)));
    }
    H5Eclear2(H5E_DEFAULT);
  }
  ++m.objects;
  const uint64_t hash = fnv1a(name, shape);
  if (m.collective) {
    // Collective transfers: every rank must enter H5Dwrite, so first agree that every rank has
    // its dataset, and that all passed the same name and shape.
    uint64_t pre[2] = {err.empty() ? 0u : 1u, hash};
    MPI_Allreduce(MPI_IN_PLACE, pre, 2, MPI_UINT64_T, MPI_SUM, m.comm);
    if (pre[0] != 0) agree_or_throw(m.comm, err);
    if (pre[1] != hash * static_cast<uint64_t>(comm_size(m.comm))) {
      throw Error(where + ": the ranks passed different dataset names or shapes (every rank "
                          "must write the same datasets, in the same order)");
    }
  }

  uint64_t sum = 0, count = 0;
  for (int64_t pass = 0; pass < passes; ++pass) {
    const TensorPiece part = piece(pass);
    const std::span<const float> local = part.local;
    // This rank's part: validated, checksummed and staged contiguously in global order.
    std::vector<Run> rs = part.runs;
    if (std::string bad = normalize_runs(rs, numel, static_cast<int64_t>(local.size()), false);
        !bad.empty()) {
      if (err.empty()) err = where + ": " + rank_prefix(m.comm) + bad;
      rs.clear();
    }
    const int64_t n = runs_length(rs);
    sum += checksum_runs(local, rs);
    count += static_cast<uint64_t>(n);
    // An empty dataset has no storage (HDF5 fails even an empty collective transfer on it).
    if (dset.valid() && numel > 0 && (m.collective || n > 0)) {
      const float* src = nullptr;
      float dummy = 0;
      if (n == 0) {
        src = &dummy;
      } else if (local_contiguous(rs)) {
        src = local.data() + rs.front().local_offset;
      } else {
        m.staging.resize(static_cast<size_t>(n));
        int64_t pos = 0;
        for (const Run& r : rs) {
          std::copy_n(local.data() + r.local_offset, r.length, m.staging.data() + pos);
          pos += r.length;
        }
        src = m.staging.data();
      }
      const hsize_t mem_dims = static_cast<hsize_t>(std::max<int64_t>(n, 1));
      Hid mem(H5Screate_simple(1, &mem_dims, nullptr), H5Sclose);
      std::string sel = select_boxes(space.get(), runs_to_boxes(shape, rs));
      if (sel.empty() && n == 0 && H5Sselect_none(mem.get()) < 0) sel = h5_detail();
      if (!sel.empty()) {
        if (err.empty()) err = where + ": " + rank_prefix(m.comm) + "cannot select: " + sel;
        H5Sselect_none(space.get());
        H5Sselect_none(mem.get());
      }
      if (H5Dwrite(dset.get(), H5T_NATIVE_FLOAT, mem.get(), space.get(), m.dxpl.get(), src) < 0 &&
          err.empty()) {
        err = where + ": " + rank_prefix(m.comm) + "write failed: " + h5_detail();
      }
    }
  }
  if (dset.reset() < 0 && err.empty()) err = where + ": cannot close: " + h5_detail();
  m.written.insert(name);
  m.pending.push_back({name, numel, hash, sum, count});
  if (m.error.empty()) m.error = err;
  data_bytes_ += numel * static_cast<int64_t>(sizeof(float));
  // Collective transfers agree now (a failed collective write must not be followed by more);
  // independent ones at close(), in one all-reduce for all datasets.
  if (m.collective) finish_pending();
  if (m.slow_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(m.slow_ms));
}

void CheckpointWriter::finish_pending() {
  Impl& m = *impl_;
  // 1) Same numbers of datasets and attributes on every rank, and nobody failed.
  const auto k = static_cast<int64_t>(m.pending.size());
  const auto na = static_cast<int64_t>(m.attributes.size());
  int64_t a[5] = {k, -k, m.error.empty() ? 0 : 1, na, -na};
  MPI_Allreduce(MPI_IN_PLACE, a, 5, MPI_INT64_T, MPI_MAX, m.comm);
  if (a[0] != -a[1]) {
    throw Error("checkpoint '" + path_ + "': the ranks wrote different numbers of datasets (" +
                std::to_string(-a[1]) + " to " + std::to_string(a[0]) +
                "); every rank must write the same datasets, in the same order");
  }
  if (a[3] != -a[4]) {
    throw Error("checkpoint '" + path_ + "': the ranks set different numbers of attributes (" +
                std::to_string(-a[4]) + " to " + std::to_string(a[3]) +
                "); every rank must set the same attributes, in the same order");
  }
  if (a[2] != 0) agree_or_throw(m.comm, m.error);
  // 2) Per dataset: the checksum parts, element counts and name/shape hashes, summed.
  std::vector<uint64_t> v(3 * m.pending.size());
  for (size_t i = 0; i < m.pending.size(); ++i) {
    v[3 * i] = m.pending[i].sum;
    v[3 * i + 1] = m.pending[i].count;
    v[3 * i + 2] = m.pending[i].hash;
  }
  MPI_Allreduce(MPI_IN_PLACE, v.data(), static_cast<int>(v.size()), MPI_UINT64_T, MPI_SUM,
                m.comm);
  const auto size = static_cast<uint64_t>(comm_size(m.comm));
  std::vector<Impl::Pending> pending = std::move(m.pending);
  m.pending.clear();
  for (size_t i = 0; i < pending.size(); ++i) {
    const Impl::Pending& p = pending[i];
    const std::string where = "checkpoint '" + path_ + "': dataset '" + p.name + "'";
    if (v[3 * i + 2] != p.hash * size) {
      throw Error(where + ": the ranks passed different dataset names or shapes (every rank "
                          "must write the same datasets, in the same order)");
    }
    if (v[3 * i + 1] != static_cast<uint64_t>(p.numel)) {
      throw Error(where + ": the ranks wrote " + std::to_string(v[3 * i + 1]) +
                  " elements in total, the dataset has " + std::to_string(p.numel) +
                  " (each element must be written by exactly one rank)");
    }
  }
  // 3) The attributes set since the last agreement, rank 0's values (one broadcast).
  if (na > 0) {
    std::string blob;
    if (comm_rank(m.comm) == 0) {
      Out out;
      for (const Impl::PendingAttribute& p : m.attributes) {
        out.u64(static_cast<uint64_t>(p.value.kind));
        out.u64(static_cast<uint64_t>(p.value.i));
        uint64_t dbits;
        std::memcpy(&dbits, &p.value.d, sizeof dbits);
        out.u64(dbits);
        out.str(p.value.text);
      }
      blob = std::move(out.buf);
    }
    blob = bcast_string(m.comm, blob, 0);
    In in{blob};
    std::vector<Impl::PendingAttribute> attrs = std::move(m.attributes);
    m.attributes.clear();
    for (Impl::PendingAttribute& p : attrs) {
      p.value.kind = static_cast<AttributeValue::Kind>(in.u64());
      p.value.i = static_cast<int64_t>(in.u64());
      const uint64_t dbits = in.u64();
      std::memcpy(&p.value.d, &dbits, sizeof dbits);
      p.value.text = in.str();
      const std::string where =
          "checkpoint '" + path_ + "': '" + p.object + "' attribute '" + p.key + "'";
      Hid o = open_or_create_object(m.file.get(), m.lcpl.get(), p.object, where);
      if (p.value.kind == AttributeValue::Kind::Int) {
        write_scalar_attribute(o.get(), p.key, H5T_STD_I64LE, H5T_NATIVE_INT64, &p.value.i,
                               where);
      } else if (p.value.kind == AttributeValue::Kind::Double) {
        write_scalar_attribute(o.get(), p.key, H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, &p.value.d,
                               where);
      } else {
        // Fixed-length, inside the attribute message that the 1.8 format checksums; a
        // variable-length string lives in the global heap, which no HDF5 format checksums
        // (damage there crashed the library's reader: docs/fuzzing.md).
        const Hid type = fixed_length_string(p.value.text.size());
        write_scalar_attribute(o.get(), p.key, type.get(), type.get(), p.value.text.data(),
                               where);
      }
      m.written_attributes[p.object][p.key] = p.value;
    }
  }
  // 4) The checksums, as attributes (collective metadata operations, same values everywhere).
  for (size_t i = 0; i < pending.size(); ++i) {
    const std::string where = "checkpoint '" + path_ + "': dataset '" + pending[i].name + "'";
    Hid d(H5Dopen2(m.file.get(), pending[i].name.c_str(), H5P_DEFAULT), H5Dclose);
    if (!d.valid()) throw Error(where + ": cannot open: " + h5_detail());
    write_scalar_attribute(d.get(), kChecksumKey, H5T_STD_U64LE, H5T_NATIVE_UINT64, &v[3 * i],
                           where);
    if (d.reset() < 0) throw Error(where + ": cannot close: " + h5_detail());
  }
}

void CheckpointWriter::set_attribute(const std::string& object, const std::string& key,
                                     int64_t value) {
  AttributeValue v;
  v.kind = AttributeValue::Kind::Int;
  v.i = value;
  queue_attribute(object, key, std::move(v));
}

void CheckpointWriter::set_attribute(const std::string& object, const std::string& key,
                                     double value) {
  AttributeValue v;
  v.kind = AttributeValue::Kind::Double;
  v.d = value;
  queue_attribute(object, key, std::move(v));
}

void CheckpointWriter::set_attribute(const std::string& object, const std::string& key,
                                     const std::string& value) {
  AttributeValue v;
  v.kind = AttributeValue::Kind::String;
  v.text = value;
  queue_attribute(object, key, std::move(v));
}

void CheckpointWriter::queue_attribute(const std::string& object, const std::string& key,
                                       AttributeValue value) {
  Impl& m = *impl_;
  const std::string obj = h5_path(object);
  const std::string where = "checkpoint '" + path_ + "': '" + obj + "' attribute '" + key + "'";
  if (m.closed) throw Error(where + ": the writer is closed");
  if (key.empty() || key.find('\0') != std::string::npos) throw Error(where + ": bad name");
  if (value.kind == AttributeValue::Kind::String && value.text.find('\0') != std::string::npos) {
    throw Error(where + ": string value contains a NUL character");
  }
  m.attribute_bytes += static_cast<int64_t>(obj.size() + key.size() + value.text.size() + 8);
  m.attributes.push_back({obj, key, std::move(value)});
}

void CheckpointWriter::seal_attributes(const std::string& object) {
  Impl& m = *impl_;
  const std::string obj = h5_path(object);
  if (m.closed) {
    throw Error("checkpoint '" + path_ + "': '" + obj + "': seal_attributes: the writer is closed");
  }
  if (std::find(m.sealed.begin(), m.sealed.end(), obj) == m.sealed.end()) m.sealed.push_back(obj);
}

std::string CheckpointWriter::reserve_metadata_room() {
  // HDF5 writes the dirty metadata in one collective MPI-IO write, which ROMIO's two-phase I/O
  // carries out in rounds of its collective buffer (16 MiB), reading and rewriting the holes
  // between the metadata blocks: about the file's whole size. A round that fails (a full
  // disk, a file-size limit) makes the writing rank leave the call at once while the others
  // wait for the next round: a hang no agreement afterwards can undo. Below the reserved size
  // no write fails for space. File systems without fallocate go without (docs/
  // checkpoint-format.md).
  Impl& m = *impl_;
  if (comm_rank(m.comm) != 0) return "";
  const int64_t bytes = m.room();
  const int err = reserve_file(path_, bytes);
  if (err == 0 || err == EOPNOTSUPP) return "";
  return "checkpoint '" + path_ + "': rank 0: cannot reserve " + std::to_string(bytes) +
         " bytes for closing the file: " + std::strerror(err);
}

void CheckpointWriter::close() {
  Impl& m = *impl_;
  if (m.closed) return;
  try {
    finish_pending();
    // The seals, last: over every attribute of the object (the same values on every rank).
    for (const std::string& obj : m.sealed) {
      const std::string where =
          "checkpoint '" + path_ + "': '" + obj + "' attribute '" + kAttributesChecksumKey + "'";
      uint64_t sum = 0;
      try {
        sum = attributes_checksum(m.written_attributes[obj]);
      } catch (const Error& e) {
        throw Error(where + ": " + e.what());
      }
      Hid o = open_or_create_object(m.file.get(), m.lcpl.get(), obj, where);
      write_scalar_attribute(o.get(), kAttributesChecksumKey, H5T_STD_U64LE, H5T_NATIVE_UINT64,
                             &sum, where);
    }
  } catch (const Error&) {
    abandon();
    throw;
  }
  // Room for the metadata first (reserve_metadata_room()), then flush: a flush that fails
  // leaves the file closable, a failing H5Fclose does not (see abandon()).
  std::string err = agree(m.comm, reserve_metadata_room());
  if (!err.empty()) {
    abandon();
    throw Error(err);
  }
  if (H5Fflush(m.file.get(), H5F_SCOPE_GLOBAL) < 0) {
    err = "checkpoint '" + path_ + "': " + rank_prefix(m.comm) + "flush failed: " + h5_detail();
  }
  err = agree(m.comm, err);
  if (!err.empty()) {
    abandon();
    throw Error(err);
  }
  m.closed = true;
  const herr_t rc = m.file.reset();  // collective
  m.restore_file_limit();
  err = rc < 0 ? "checkpoint '" + path_ + "': " + rank_prefix(m.comm) + "close failed: " +
                     h5_detail()
               : "";
  agree_or_throw(m.comm, err);
}

// ---------------------------------------------------------------------------------------------
// Reader

struct CheckpointReader::Impl {
  MPI_Comm comm = MPI_COMM_NULL;
  Hid file, dxpl;
  bool collective = false;  // collective tensor transfers
  // Datasets read since the last finish(): this rank's checksum part of each, and its first
  // error.
  struct Pending {
    std::string name;
    int64_t numel;
    uint64_t sum, counted;
    uint64_t checksum;  // the stored one
  };
  std::vector<Pending> pending;
  std::string error;        // I/O and argument errors of this rank (first one)
  std::string value_error;  // values that fail options.value_check (first one)
  std::function<ValueCheck(const std::string&)> value_check;
  std::vector<float> staging;
  bool closed = false;
};

namespace {

using ObjectMap = std::map<std::string, AttributeValue>;

AttributeValue read_attribute_value(hid_t attr) {
  AttributeValue v;
  Hid type(H5Aget_type(attr), H5Tclose);
  Hid space(H5Aget_space(attr), H5Sclose);
  if (!type.valid() || !space.valid()) {
    v.text = "unreadable: " + h5_detail();
    return v;
  }
  const hssize_t npoints = H5Sget_simple_extent_npoints(space.get());
  const H5T_class_t cls = H5Tget_class(type.get());
  if (npoints != 1) {
    v.text = dtype_name(type.get()) + " array of " + std::to_string(npoints) + " elements";
    return v;
  }
  if (cls == H5T_INTEGER) {
    if (H5Tget_sign(type.get()) == H5T_SGN_NONE && H5Tget_size(type.get()) == 8) {
      if (H5Aread(attr, H5T_NATIVE_UINT64, &v.u) >= 0) v.kind = AttributeValue::Kind::Uint;
    } else if (H5Aread(attr, H5T_NATIVE_INT64, &v.i) >= 0) {
      v.kind = AttributeValue::Kind::Int;
    }
  } else if (cls == H5T_FLOAT) {
    if (H5Aread(attr, H5T_NATIVE_DOUBLE, &v.d) >= 0) v.kind = AttributeValue::Kind::Double;
  } else if (cls == H5T_STRING) {
    if (H5Tis_variable_str(type.get()) > 0) {
      Hid mt(H5Tcopy(H5T_C_S1), H5Tclose);
      H5Tset_size(mt.get(), H5T_VARIABLE);
      H5Tset_cset(mt.get(), H5Tget_cset(type.get()));
      char* p = nullptr;
      if (H5Aread(attr, mt.get(), &p) >= 0) {
        v.kind = AttributeValue::Kind::String;
        v.text = p ? p : "";
        H5free_memory(p);
      }
    } else {
      const size_t n = H5Tget_size(type.get());
      std::vector<char> buf(n + 1, '\0');
      Hid mt(H5Tcopy(H5T_C_S1), H5Tclose);
      H5Tset_size(mt.get(), n + 1);
      H5Tset_cset(mt.get(), H5Tget_cset(type.get()));
      if (H5Aread(attr, mt.get(), buf.data()) >= 0) {
        v.kind = AttributeValue::Kind::String;
        v.text = std::string(buf.data(), strnlen(buf.data(), n));
      }
    }
  } else {
    v.text = dtype_name(type.get());
    return v;
  }
  if (v.kind == AttributeValue::Kind::Other) v.text = "unreadable: " + h5_detail();
  return v;
}

herr_t collect_attribute(hid_t obj, const char* name, const H5A_info_t*, void* data) {
  auto* out = static_cast<ObjectMap*>(data);
  Hid a(H5Aopen(obj, name, H5P_DEFAULT), H5Aclose);
  if (!a.valid()) return -1;
  (*out)[name] = read_attribute_value(a.get());
  return 0;
}

struct ScanState {
  std::map<std::string, AttributeValue>* root_attrs = nullptr;
  std::vector<std::tuple<std::string, bool, std::vector<int64_t>, std::string, ObjectMap>> objects;
  std::string error;
};

herr_t visit_link(hid_t group, const char* name, const H5L_info_t* info, void* data) {
  auto* st = static_cast<ScanState*>(data);
  if (info->type != H5L_TYPE_HARD) return 0;  // soft/external links are not followed
  Hid o(H5Oopen(group, name, H5P_DEFAULT), H5Oclose);
  if (!o.valid()) {
    st->error = std::string("cannot open object '/") + name + "': " + h5_detail();
    return -1;
  }
  const H5I_type_t t = H5Iget_type(o.get());
  if (t != H5I_GROUP && t != H5I_DATASET) return 0;  // named datatypes
  ObjectMap attrs;
  if (H5Aiterate2(o.get(), H5_INDEX_NAME, H5_ITER_INC, nullptr, collect_attribute, &attrs) < 0) {
    st->error = std::string("cannot read the attributes of '/") + name + "': " + h5_detail();
    return -1;
  }
  std::vector<int64_t> shape;
  std::string dtype;
  if (t == H5I_DATASET) {
    Hid space(H5Dget_space(o.get()), H5Sclose);
    Hid type(H5Dget_type(o.get()), H5Tclose);
    const int nd = space.valid() ? H5Sget_simple_extent_ndims(space.get()) : -1;
    if (nd < 0 || !type.valid()) {
      st->error = std::string("cannot read dataset '/") + name + "': " + h5_detail();
      return -1;
    }
    std::vector<hsize_t> dims(static_cast<size_t>(nd));
    H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr);
    shape.assign(dims.begin(), dims.end());
    dtype = dtype_name(type.get());
  }
  st->objects.emplace_back("/" + std::string(name), t == H5I_DATASET, std::move(shape),
                           std::move(dtype), std::move(attrs));
  return 0;
}

}  // namespace

CheckpointReader::CheckpointReader(const std::string& path, MPI_Comm comm,
                                   const ReaderOptions& options)
    : impl_(std::make_unique<Impl>()), path_(path) {
  h5_init();
  Impl& m = *impl_;
  MPI_Comm_dup(comm, &m.comm);
  const std::string where = "checkpoint '" + path + "'";

  // Rank 0 checks the file and reads the index (every object, shape and attribute) with the
  // serial driver, and broadcasts it: 'E' + message, or 'I' + serialized index.
  std::string msg;
  if (comm_rank(m.comm) == 0) {
    std::string err;
    Out out;
    struct stat st{};
    if (stat(path.c_str(), &st) != 0) {
      err = where + ": cannot open: " + std::strerror(errno);
    } else if (!S_ISREG(st.st_mode)) {
      err = where + ": not a regular file";
    } else if (H5Fis_hdf5(path.c_str()) <= 0) {
      H5Eclear2(H5E_DEFAULT);
      err = where + ": not an HDF5 file (" + std::to_string(st.st_size) + " bytes)";
    } else {
      // Serial driver, no file locking (rank 0 only reads; some parallel file systems refuse
      // flock).
      Hid serial(H5Pcreate(H5P_FILE_ACCESS), H5Pclose);
      H5Pset_file_locking(serial.get(), false, true);
      Hid f(H5Fopen(path.c_str(), H5F_ACC_RDONLY, serial.get()), H5Fclose);
      ScanState scan;
      ObjectMap root_attrs;
      if (!f.valid()) {
        err = where + ": cannot open (truncated or damaged?): " + h5_detail();
      } else if (H5Aiterate2(f.get(), H5_INDEX_NAME, H5_ITER_INC, nullptr, collect_attribute,
                             &root_attrs) < 0) {
        err = where + ": cannot read the root attributes: " + h5_detail();
      } else if (H5Lvisit(f.get(), H5_INDEX_NAME, H5_ITER_INC, visit_link, &scan) < 0) {
        err = where + ": " + (scan.error.empty() ? "cannot list: " + h5_detail() : scan.error);
      } else {
        scan.objects.emplace_back("/", false, std::vector<int64_t>{}, "", std::move(root_attrs));
        out.u64(scan.objects.size());
        for (const auto& [name, is_ds, shape, dtype, attrs] : scan.objects) {
          out.str(name);
          out.u64(is_ds);
          out.str(dtype);
          out.u64(shape.size());
          for (int64_t d : shape) out.u64(static_cast<uint64_t>(d));
          out.u64(attrs.size());
          for (const auto& [k, v] : attrs) {
            out.str(k);
            out.u64(static_cast<uint64_t>(v.kind));
            out.u64(static_cast<uint64_t>(v.i));
            out.u64(v.u);
            uint64_t dbits;
            std::memcpy(&dbits, &v.d, sizeof dbits);
            out.u64(dbits);
            out.str(v.text);
          }
        }
      }
      if (f.reset() < 0 && err.empty()) err = where + ": cannot close: " + h5_detail();
    }
    msg = err.empty() ? "I" + out.buf : "E" + err;
  }
  msg = bcast_string(m.comm, msg, 0);
  if (msg[0] == 'E') {
    MPI_Comm_free(&m.comm);
    throw Error(msg.substr(1));
  }
  const std::string blob = msg.substr(1);
  In in{blob};
  const uint64_t nobj = in.u64();
  for (uint64_t i = 0; i < nobj; ++i) {
    std::string name = in.str();
    Object& o = index_[name];
    o.is_dataset = in.u64() != 0;
    o.dtype = in.str();
    o.shape.resize(in.u64());
    for (int64_t& d : o.shape) d = static_cast<int64_t>(in.u64());
    const uint64_t nattr = in.u64();
    for (uint64_t j = 0; j < nattr; ++j) {
      std::string k = in.str();
      AttributeValue& v = o.attributes[k];
      v.kind = static_cast<AttributeValue::Kind>(in.u64());
      v.i = static_cast<int64_t>(in.u64());
      v.u = in.u64();
      const uint64_t dbits = in.u64();
      std::memcpy(&v.d, &dbits, sizeof dbits);
      v.text = in.str();
    }
  }

  Hid fapl(H5Pcreate(H5P_FILE_ACCESS), H5Pclose);
  std::string err;
  MPI_Info info = MPI_INFO_NULL;  // as in the writer: read errors agreed on in collective reads
  MPI_Info_create(&info);
  MPI_Info_set(info, "romio_cb_read", "enable");
  const bool mpio_ok = fapl.valid() && H5Pset_fapl_mpio(fapl.get(), m.comm, info) >= 0;
  MPI_Info_free(&info);
  if (!mpio_ok) {
    err = where + ": cannot set up MPI-IO: " + h5_detail();
  } else {
    m.file = Hid(H5Fopen(path.c_str(), H5F_ACC_RDONLY, fapl.get()), H5Fclose);
    if (!m.file.valid()) err = where + ": " + rank_prefix(m.comm) + "cannot open: " + h5_detail();
  }
  err = agree(m.comm, err);
  if (!err.empty()) {
    // As in the writer: a file open on some ranks only is left open rather than hanging.
    m.file.release();
    MPI_Comm_free(&m.comm);
    throw Error(err);
  }
  m.collective = options.collective_data;
  m.value_check = options.value_check;
  m.dxpl = Hid(H5Pcreate(H5P_DATASET_XFER), H5Pclose);
  H5Pset_dxpl_mpio(m.dxpl.get(),
                   options.collective_data ? H5FD_MPIO_COLLECTIVE : H5FD_MPIO_INDEPENDENT);
}

CheckpointReader::~CheckpointReader() {
  if (!impl_) return;
  Impl& m = *impl_;
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) {
    m.file.release();
    return;
  }
  if (!m.closed) {
    (void)m.file.reset();  // collective
    H5Eclear2(H5E_DEFAULT);
  }
  if (m.comm != MPI_COMM_NULL) MPI_Comm_free(&m.comm);
}

void CheckpointReader::close() {
  Impl& m = *impl_;
  if (m.closed) return;
  m.closed = true;
  std::string pending_error;
  try {
    finish();
  } catch (const Error& e) {
    pending_error = e.what();  // the same on every rank
  }
  const herr_t rc = m.file.reset();
  agree_or_throw(m.comm, rc < 0 ? "checkpoint '" + path_ + "': " + rank_prefix(m.comm) +
                                      "close failed: " + h5_detail()
                                : "");
  if (!pending_error.empty()) throw Error(pending_error);
}

const CheckpointReader::Object& CheckpointReader::object_entry(const std::string& name) const {
  auto it = index_.find(h5_path(name));
  if (it == index_.end()) {
    throw Error("checkpoint '" + path_ + "': no object '" + h5_path(name) + "'");
  }
  return it->second;
}

const CheckpointReader::Object& CheckpointReader::dataset_entry(const std::string& name) const {
  auto it = index_.find(h5_path(name));
  if (it == index_.end() || !it->second.is_dataset) {
    throw Error("checkpoint '" + path_ + "': no dataset '" + h5_path(name) + "'");
  }
  return it->second;
}

bool CheckpointReader::has_dataset(const std::string& name) const {
  auto it = index_.find(h5_path(name));
  return it != index_.end() && it->second.is_dataset;
}

std::vector<int64_t> CheckpointReader::shape(const std::string& name) const {
  return dataset_entry(name).shape;
}

std::vector<std::string> CheckpointReader::datasets() const {
  std::vector<std::string> out;
  for (const auto& [name, o] : index_) {
    if (o.is_dataset) out.push_back(name);
  }
  return out;  // std::map order: sorted
}

bool CheckpointReader::has_attribute(const std::string& object, const std::string& key) const {
  auto it = index_.find(h5_path(object));
  return it != index_.end() && it->second.attributes.count(key) > 0;
}

std::vector<std::string> CheckpointReader::attributes(const std::string& object) const {
  std::vector<std::string> out;
  for (const auto& [k, v] : object_entry(object).attributes) out.push_back(k);
  return out;
}

const AttributeValue& CheckpointReader::attribute(const std::string& object,
                                                  const std::string& key) const {
  const Object& o = object_entry(object);
  auto it = o.attributes.find(key);
  if (it == o.attributes.end()) {
    throw Error("checkpoint '" + path_ + "': '" + h5_path(object) + "' has no attribute '" +
                key + "'");
  }
  return it->second;
}

std::string CheckpointReader::dtype(const std::string& name) const {
  return dataset_entry(name).dtype;
}

uint64_t CheckpointReader::checksum(const std::string& name) const {
  const Object& o = dataset_entry(name);
  const std::string where = "checkpoint '" + path_ + "': dataset '" + h5_path(name) + "'";
  auto it = o.attributes.find(kChecksumKey);
  if (it == o.attributes.end()) throw Error(where + " has no '" + kChecksumKey + "' attribute");
  if (it->second.kind != AttributeValue::Kind::Uint) {
    static const char* kinds[] = {"an integer", "an unsigned integer", "a floating-point number",
                                  "a string", "of another type"};
    throw Error(where + ": its '" + kChecksumKey + "' attribute is " +
                kinds[static_cast<int>(it->second.kind)] + ", expected uint64");
  }
  return it->second.u;
}

void CheckpointReader::verify_attributes(const std::string& object) const {
  const Object& o = object_entry(object);
  const std::string where = "checkpoint '" + path_ + "': the attributes of '" + h5_path(object) + "'";
  auto it = o.attributes.find(kAttributesChecksumKey);
  if (it == o.attributes.end()) {
    throw Error(where + " are not sealed (no '" + kAttributesChecksumKey + "' attribute)");
  }
  if (it->second.kind != AttributeValue::Kind::Uint) {
    throw Error(where + ": '" + kAttributesChecksumKey + "' is not a uint64");
  }
  uint64_t sum = 0;
  try {
    sum = attributes_checksum(o.attributes);
  } catch (const Error& e) {
    throw Error(where + ": " + e.what());
  }
  if (sum != it->second.u) {
    throw Error(where + " are corrupt (" + kAttributesChecksumKey + " mismatch)");
  }
}

namespace {
[[noreturn]] void wrong_type(const std::string& path, const std::string& object,
                             const std::string& key, const char* wanted,
                             const AttributeValue& v) {
  static const char* kinds[] = {"an integer", "an unsigned integer", "a floating-point number",
                                "a string", "of another type"};
  std::string found = kinds[static_cast<int>(v.kind)];
  if (v.kind == AttributeValue::Kind::Other) found += " (" + v.text + ")";
  throw Error("checkpoint '" + path + "': '" + h5_path(object) + "' attribute '" + key +
              "' is " + found + ", expected " + wanted);
}
}  // namespace

int64_t CheckpointReader::attribute_int(const std::string& object, const std::string& key) const {
  const AttributeValue& v = attribute(object, key);
  if (v.kind == AttributeValue::Kind::Int) return v.i;
  if (v.kind == AttributeValue::Kind::Uint && v.u <= static_cast<uint64_t>(INT64_MAX)) {
    return static_cast<int64_t>(v.u);
  }
  wrong_type(path_, object, key, "an integer (int64)", v);
}

double CheckpointReader::attribute_double(const std::string& object,
                                          const std::string& key) const {
  const AttributeValue& v = attribute(object, key);
  if (v.kind == AttributeValue::Kind::Double) return v.d;
  if (v.kind == AttributeValue::Kind::Int) return static_cast<double>(v.i);
  if (v.kind == AttributeValue::Kind::Uint) return static_cast<double>(v.u);
  wrong_type(path_, object, key, "a number", v);
}

std::string CheckpointReader::attribute_string(const std::string& object,
                                               const std::string& key) const {
  const AttributeValue& v = attribute(object, key);
  if (v.kind == AttributeValue::Kind::String) return v.text;
  wrong_type(path_, object, key, "a string", v);
}

namespace {

// Opens the dataset. Collective transfers: on every rank, throwing on every rank if any rank
// failed or has `error` set. Independent: a failure is added to `error` (the caller agrees
// later) and the handle is invalid.
Hid open_dataset(MPI_Comm comm, hid_t file, const std::string& name, const std::string& where,
                 bool collective, std::string& error) {
  Hid d;
  if (error.empty() || collective) {
    d = Hid(H5Dopen2(file, name.c_str(), H5P_DEFAULT), H5Dclose);
    if (!d.valid() && error.empty()) {
      error = where + ": " + rank_prefix(comm) + "cannot open: " + h5_detail();
    }
  }
  if (collective) {
    error = agree(comm, error);
    if (!error.empty()) throw Error(error);
  }
  return d;
}

// Reads the (normalized, validated) runs of `dset` into local. Returns this rank's error (""
// if none). Collective transfers: every rank calls, one with an error or nothing to read with
// an empty selection; independent: nothing happens without a dataset or runs.
std::string read_runs(MPI_Comm comm, hid_t dset, hid_t dxpl, bool collective,
                      const std::vector<int64_t>& shape, const std::vector<Run>& rs, float* local,
                      std::vector<float>& staging, const std::string& where) {
  const int64_t n = runs_length(rs);
  if (!collective && (dset < 0 || n == 0)) return "";
  const bool direct = n == 0 || local_contiguous(rs);
  float dummy = 0;
  float* dst = &dummy;
  if (n > 0) {
    if (direct) {
      dst = local + rs.front().local_offset;
    } else {
      staging.resize(static_cast<size_t>(n));
      dst = staging.data();
    }
  }
  std::string err;
  Hid space(H5Dget_space(dset), H5Sclose);
  const hsize_t mem_dims = static_cast<hsize_t>(std::max<int64_t>(n, 1));
  Hid mem(H5Screate_simple(1, &mem_dims, nullptr), H5Sclose);
  std::string sel = select_boxes(space.get(), runs_to_boxes(shape, rs));
  if (sel.empty() && n == 0 && H5Sselect_none(mem.get()) < 0) sel = h5_detail();
  if (!sel.empty()) {
    err = where + ": " + rank_prefix(comm) + "cannot select: " + sel;
    H5Sselect_none(space.get());
    H5Sselect_none(mem.get());
  }
  if (H5Dread(dset, H5T_NATIVE_FLOAT, mem.get(), space.get(), dxpl, dst) < 0 && err.empty()) {
    err = where + ": " + rank_prefix(comm) + "read failed: " + h5_detail();
  }
  if (err.empty() && !direct) {
    int64_t pos = 0;
    for (const Run& r : rs) {
      std::copy_n(staging.data() + pos, r.length, local + r.local_offset);
      pos += r.length;
    }
  }
  return err;
}

}  // namespace

void CheckpointReader::read_tensor(const std::string& name_in,
                                   const std::vector<int64_t>& expected_shape,
                                   const std::vector<Run>& runs, std::span<float> local,
                                   const ChecksumShare& share) {
  Impl& m = *impl_;
  const std::string name = h5_path(name_in);
  const std::string where = "checkpoint '" + path_ + "': dataset '" + name + "'";
  if (m.closed) throw Error(where + ": the reader is closed");
  const Object& o = dataset_entry(name);
  if (o.shape != expected_shape) {
    throw Error(where + ": shape mismatch: expected " + shape_string(expected_shape) +
                ", found " + shape_string(o.shape));
  }
  if (o.dtype.rfind("float", 0) != 0) {
    throw Error(where + ": has type " + o.dtype + ", expected floating point");
  }
  const uint64_t stored = checksum(name);
  const int64_t numel = shape_numel(o.shape);
  const auto local_size = static_cast<int64_t>(local.size());

  std::vector<Run> rs = runs;
  std::string err = normalize_runs(rs, numel, local_size, true);
  std::vector<Run> counted;
  if (err.empty()) {
    if (share.kind() == ChecksumShare::Kind::All) {
      counted = rs;
    } else if (share.kind() == ChecksumShare::Kind::Only) {
      counted = share.runs();
      err = normalize_runs(counted, numel, local_size, true);
      if (err.empty()) err = runs_subset(counted, rs);
      if (!err.empty()) err = "checksum share: " + err;
    }
  }
  if (!err.empty()) {
    err = where + ": " + rank_prefix(m.comm) + err;
    rs.clear();
    counted.clear();
  }
  Hid dset = open_dataset(m.comm, m.file.get(), name, where, m.collective, err);
  if (err.empty() && numel > 0) {
    err = read_runs(m.comm, dset.get(), m.dxpl.get(), m.collective, o.shape, rs, local.data(),
                    m.staging, where);
  }
  // Checked at finish(), for all datasets read, in one agreement.
  const uint64_t sum = err.empty() ? checksum_runs(local, counted) : 0;
  if (err.empty() && m.value_error.empty() && m.value_check) {
    const std::string bad = check_values_runs(local, rs, m.value_check(name));
    if (!bad.empty()) m.value_error = where + " " + bad;
  }
  m.pending.push_back({name, numel, sum, static_cast<uint64_t>(runs_length(counted)), stored});
  if (m.error.empty()) m.error = err;
}

void CheckpointReader::finish() {
  Impl& m = *impl_;
  const auto k = static_cast<int64_t>(m.pending.size());
  int64_t a[3] = {k, -k, m.error.empty() ? 0 : 1};
  MPI_Allreduce(MPI_IN_PLACE, a, 3, MPI_INT64_T, MPI_MAX, m.comm);
  std::vector<Impl::Pending> pending = std::move(m.pending);
  m.pending.clear();
  std::string error = std::move(m.error);
  m.error.clear();
  std::string value_error = std::move(m.value_error);
  m.value_error.clear();
  if (a[0] != -a[1]) {
    throw Error("checkpoint '" + path_ + "': the ranks read different numbers of datasets (" +
                std::to_string(-a[1]) + " to " + std::to_string(a[0]) +
                "); every rank must read the same datasets, in the same order");
  }
  if (a[2] != 0) agree_or_throw(m.comm, error);
  std::vector<uint64_t> v(2 * pending.size());
  for (size_t i = 0; i < pending.size(); ++i) {
    v[2 * i] = pending[i].sum;
    v[2 * i + 1] = pending[i].counted;
  }
  MPI_Allreduce(MPI_IN_PLACE, v.data(), static_cast<int>(v.size()), MPI_UINT64_T, MPI_SUM,
                m.comm);
  for (size_t i = 0; i < pending.size(); ++i) {
    const Impl::Pending& p = pending[i];
    const std::string where = "checkpoint '" + path_ + "': dataset '" + p.name + "'";
    const uint64_t counted = v[2 * i + 1];
    if (counted == 0) continue;  // nobody counted: no check
    if (counted != static_cast<uint64_t>(p.numel)) {
      throw Error(where + ": the ranks counted " + std::to_string(counted) +
                  " elements toward the checksum, the dataset has " + std::to_string(p.numel) +
                  " (each element must be counted by exactly one rank, see ChecksumShare)");
    }
    if (p.checksum != v[2 * i]) throw Error(where + " is corrupt (checksum mismatch)");
  }
  // Intact data that the caller does not accept (ReaderOptions::value_check).
  agree_or_throw(m.comm, value_error);
}

void CheckpointReader::verify(const std::string& name_in, int64_t chunk_elements) {
  Impl& m = *impl_;
  const std::string name = h5_path(name_in);
  const std::string where = "checkpoint '" + path_ + "': dataset '" + name + "'";
  if (m.closed) throw Error(where + ": the reader is closed");
  const Object& o = dataset_entry(name);
  const uint64_t stored = checksum(name);
  if (o.dtype != "float32") throw Error(where + ": has type " + o.dtype + ", expected float32");
  const ValueCheck check = m.value_check ? m.value_check(name) : ValueCheck::Any;
  std::string value_error;
  const int64_t numel = shape_numel(o.shape);
  const int size = comm_size(m.comm), rank = comm_rank(m.comm);
  const int64_t per_rank = (numel + size - 1) / size;
  const int64_t begin = std::min(numel, per_rank * rank);
  const int64_t end = std::min(numel, begin + per_rank);
  const int64_t chunk = std::max<int64_t>(1, chunk_elements);
  const int64_t rounds = (per_rank + chunk - 1) / chunk;  // the same on every rank

  std::string err;
  Hid dset = open_dataset(m.comm, m.file.get(), name, where, m.collective, err);
  std::vector<float> buf(static_cast<size_t>(std::min(chunk, std::max<int64_t>(end - begin, 0))));
  uint64_t sum = 0;
  for (int64_t k = 0; k < rounds; ++k) {
    const int64_t b = std::min(end, begin + k * chunk), e = std::min(end, b + chunk);
    std::vector<Run> rs;
    if (e > b && err.empty()) rs.push_back(Run{0, b, e - b});
    std::string e2 = read_runs(m.comm, dset.get(), m.dxpl.get(), m.collective, o.shape, rs,
                               buf.data(), m.staging, where);
    if (err.empty()) err = e2;
    if (err.empty() && !rs.empty()) {
      sum += checksum_range(buf.data(), b, e - b);
      if (value_error.empty()) {
        const std::string bad = check_values(buf.data(), b, e - b, check);
        if (!bad.empty()) value_error = where + " " + bad;
      }
    }
  }
  uint64_t post[2] = {sum, err.empty() ? 0u : 1u};
  MPI_Allreduce(MPI_IN_PLACE, post, 2, MPI_UINT64_T, MPI_SUM, m.comm);
  if (post[1] != 0) agree_or_throw(m.comm, err);
  if (stored != post[0]) throw Error(where + " is corrupt (checksum mismatch)");
  agree_or_throw(m.comm, value_error);
}

void CheckpointReader::verify_all(int64_t chunk_elements) {
  for (const std::string& name : datasets()) verify(name, chunk_elements);
}

}  // namespace trident
