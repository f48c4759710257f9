// kernel_copy.cu — the copy kernel: a host-to-device copy done by the SMs, reading pinned host
// memory through its device mapping (Note [copy kernel] in kernel_copy.hpp). Built into a fat
// binary embedded in libtagmem; the emulated driver runs it as a copy (Note [emu kernels]).

// Each thread moves 16-byte words, four in flight, over a grid-stride loop; misaligned ends
// (which tagmem's pieces do not have, but a caller may) go byte by byte.
extern "C" __global__ void tagmem_h2d_copy(const unsigned char* __restrict__ src,
                                           unsigned char* __restrict__ dst,
                                           unsigned long long bytes) {
  const unsigned long long stride = static_cast<unsigned long long>(gridDim.x) * blockDim.x;
  const unsigned long long first =
      static_cast<unsigned long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  unsigned long long words = 0;
  if (((reinterpret_cast<unsigned long long>(src) | reinterpret_cast<unsigned long long>(dst)) &
       15) == 0) {
    words = bytes / 16;
    const uint4* s = reinterpret_cast<const uint4*>(src);
    uint4* d = reinterpret_cast<uint4*>(dst);
    unsigned long long i = first;
    for (; i + 3 * stride < words; i += 4 * stride) {
      const uint4 a = s[i], b = s[i + stride], c = s[i + 2 * stride], e = s[i + 3 * stride];
      d[i] = a;
      d[i + stride] = b;
      d[i + 2 * stride] = c;
      d[i + 3 * stride] = e;
    }
    for (; i < words; i += stride) d[i] = s[i];
  }
  for (unsigned long long i = words * 16 + first; i < bytes; i += stride) dst[i] = src[i];
}
