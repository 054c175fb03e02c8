// Compares two Trident checkpoints tensor by tensor, bit for bit, through Trident's own reader
// (checksums and values verified as they are read), for the chaos test
// (tests/tools/test_chaos.py): "compared D datasets, E elements: K differ" and exit 0 only
// when both hold the same datasets with the same shapes, every element is bitwise equal and
// at least one element was compared.
//   ckpt_compare A.h5 B.h5
// Exit status 1 with one line naming what differs; 2 on a trident::Error (an unreadable file).
#include <mpi.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "checkpoint/h5_file.hpp"
#include "train/checkpointing.hpp"
#include "util/error.hpp"

namespace {

int64_t element_count(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// Every element of dataset `name` of an open checkpoint (checked at close()).
std::vector<float> read_whole(trident::CheckpointReader& reader, const std::string& name) {
  const std::vector<int64_t> shape = reader.shape(name);
  std::vector<float> values(static_cast<size_t>(element_count(shape)));
  reader.read_tensor(name, shape, {{0, 0, static_cast<int64_t>(values.size())}}, values);
  return values;
}

int compare(const std::string& a_path, const std::string& b_path) {
  trident::CheckpointReader a(a_path, MPI_COMM_SELF, trident::checkpoint_reader_options());
  trident::CheckpointReader b(b_path, MPI_COMM_SELF, trident::checkpoint_reader_options());
  if (a.datasets() != b.datasets()) {
    std::printf("different datasets in %s and %s\n", a_path.c_str(), b_path.c_str());
    return 1;
  }
  int64_t elements = 0, differing = 0;
  std::string first_difference;
  for (const std::string& name : a.datasets()) {
    if (a.shape(name) != b.shape(name)) {
      std::printf("dataset %s: different shapes\n", name.c_str());
      return 1;
    }
    const std::vector<float> x = read_whole(a, name), y = read_whole(b, name);
    for (size_t i = 0; i < x.size(); ++i) {
      if (std::memcmp(&x[i], &y[i], sizeof(float)) == 0) continue;
      if (differing++ == 0) first_difference = name + " element " + std::to_string(i);
    }
    elements += static_cast<int64_t>(x.size());
  }
  a.close();
  b.close();
  std::printf("compared %zu datasets, %lld elements: %lld differ%s%s\n", a.datasets().size(),
              static_cast<long long>(elements), static_cast<long long>(differing),
              differing > 0 ? ", first " : "", first_difference.c_str());
  return differing == 0 && elements > 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int code = 2;
  if (argc != 3) {
    std::fprintf(stderr, "usage: ckpt_compare A.h5 B.h5\n");
  } else {
    try {
      code = compare(argv[1], argv[2]);
    } catch (const trident::Error& e) {
      std::printf("error: %s\n", e.what());
    }
  }
  std::fflush(stdout);
  MPI_Finalize();
  return code;
}
