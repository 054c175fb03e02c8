#pragma once
// Scratch memory of the CPU kernels that outlives their calls, so that a training step
// allocates nothing on the host once the first steps have run: a use site's buffer grows to
// the largest call it has seen on that thread and then stays. Per thread, because OpenMP
// keeps its worker threads: a buffer belongs to the thread that asked for it (a kernel may
// share its calling thread's buffer with its workers for the duration of the call). Each use
// site names its own Tag type, so two buffers in use at once never alias. The contents are
// whatever the last call left: callers write every element before they read it.
#include <cstddef>
#include <vector>

namespace trident::cpu {

template <typename Tag, typename T>
T* thread_scratch(size_t n) {
  thread_local std::vector<T> buffer;
  if (buffer.size() < n) buffer.resize(n);
  return buffer.data();
}

}  // namespace trident::cpu
