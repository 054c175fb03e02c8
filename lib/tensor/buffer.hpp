#pragma once
// Host memory for parameters, gradients and activations: a std::vector whose storage is
// 64-byte aligned (one cache line, one AVX-512 vector), so BLAS and vector loops start aligned.
#include <cstddef>
#include <new>
#include <vector>

namespace trident {

template <typename T, std::size_t Alignment = 64>
struct AlignedAllocator {
  using value_type = T;
  AlignedAllocator() = default;
  template <typename U>
  AlignedAllocator(const AlignedAllocator<U, Alignment>&) {}
  template <typename U>
  struct rebind {
    using other = AlignedAllocator<U, Alignment>;
  };
  T* allocate(std::size_t n) {
    return static_cast<T*>(::operator new(n * sizeof(T), std::align_val_t(Alignment)));
  }
  void deallocate(T* p, std::size_t) { ::operator delete(p, std::align_val_t(Alignment)); }
  friend bool operator==(const AlignedAllocator&, const AlignedAllocator&) { return true; }
};

template <typename T>
using Buffer = std::vector<T, AlignedAllocator<T>>;

}  // namespace trident
