// Metal shading-language emulation: lets a kernel body from csrc/metal compile as C++ and run
// on a CPU with the semantics the body relies on (see ../SUBSET.md).
//
// Invariant kept: every construct defined here computes what the Metal construct computes, in a
// fixed order that does not depend on how many threadgroups run or in which order they run. A
// construct outside the documented subset is deliberately left undefined, so a body that uses it
// fails to compile here (for example metal::fast::*, metal::precise::*, vector types other than
// uint3, atomics, simdgroup matrices, implicit half/bfloat conversions).
#ifndef EXACTDRAFT_METAL_EMU_H
#define EXACTDRAFT_METAL_EMU_H

#include <stddef.h>
#include <stdint.h>

typedef unsigned int uint;
typedef unsigned short ushort;
typedef unsigned char uchar;

struct uint3 {
  uint x, y, z;
};

namespace metal_emu {

// What one emulated GPU thread sees through the Metal thread attributes.
struct ThreadAttributes {
  uint3 thread_position_in_grid;
  uint3 thread_position_in_threadgroup;
  uint3 threadgroup_position_in_grid;
  uint3 threads_per_threadgroup;
  uint3 threadgroups_per_grid;
  uint3 threads_per_grid;
  uint thread_index_in_threadgroup;
  uint thread_index_in_simdgroup;
  uint simdgroup_index_in_threadgroup;
  uint simdgroups_per_threadgroup;
  uint threads_per_simdgroup;
  uint thread_execution_width;
};

typedef void (*ThreadEntry)(void* context, const ThreadAttributes* attributes);

// Runs `entry` once per thread of the grid; threadgroups one after another, the threads of a
// threadgroup as cooperative fibers. Returns 0, or 1 with a message in `error`.
int launch(ThreadEntry entry, void* context, const uint32_t grid[3],
           const uint32_t threadgroup[3], int reverse_thread_order, char* error, int error_size);

void threadgroup_barrier_wait();
// Deposits one lane's 32-bit value for a SIMD-group operation of kind `kind`; returns the 32
// values of the SIMD-group, in lane order, once every lane has arrived.
const uint32_t* simd_exchange(uint32_t bits, uint32_t kind);
uint current_lane();
[[noreturn]] void fail(const char* message);

inline uint32_t float_bits(float value) {
  uint32_t bits;
  __builtin_memcpy(&bits, &value, 4);
  return bits;
}

inline float bits_float(uint32_t bits) {
  float value;
  __builtin_memcpy(&value, &bits, 4);
  return value;
}

// Round to nearest, ties to even; NaN stays a quiet NaN.
inline uint16_t float_to_bfloat16_bits(float value) {
  uint32_t bits = float_bits(value);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((bits >> 16) | 0x40u);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return (uint16_t)(bits >> 16);
}

inline uint16_t float_to_half_bits(float value) {
  uint32_t bits = float_bits(value);
  uint32_t sign = (bits >> 16) & 0x8000u;
  uint32_t magnitude = bits & 0x7fffffffu;
  if (magnitude > 0x7f800000u) return (uint16_t)(sign | 0x7e00u);
  if (magnitude >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);  // rounds to infinity
  if (magnitude < 0x38800000u) {  // below the smallest normal half: subnormal or zero
    if (magnitude <= 0x33000000u) return (uint16_t)sign;
    uint32_t exponent = magnitude >> 23;
    uint32_t mantissa = (magnitude & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126u - exponent;
    uint32_t result = mantissa >> shift;
    uint32_t rest = mantissa & ((1u << shift) - 1u);
    uint32_t halfway = 1u << (shift - 1u);
    if (rest > halfway || (rest == halfway && (result & 1u))) result += 1u;
    return (uint16_t)(sign | result);
  }
  uint32_t rebased = magnitude - 0x38000000u;
  rebased += 0xfffu + ((rebased >> 13) & 1u);
  return (uint16_t)(sign | (rebased >> 13));
}

inline float half_bits_to_float(uint16_t half) {
  uint32_t sign = (uint32_t)(half & 0x8000u) << 16;
  uint32_t exponent = (half >> 10) & 0x1fu;
  uint32_t mantissa = half & 0x3ffu;
  if (exponent == 0) {
    float magnitude = (float)mantissa * 5.9604644775390625e-8f;  // exact: mantissa * 2^-24
    return bits_float(float_bits(magnitude) | sign);
  }
  if (exponent == 31) return bits_float(sign | 0x7f800000u | (mantissa << 13));
  return bits_float(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

template <typename T>
struct simd_value_kind;
template <>
struct simd_value_kind<float> {
  static constexpr uint32_t value = 1;
};
template <>
struct simd_value_kind<int> {
  static constexpr uint32_t value = 2;
};
template <>
struct simd_value_kind<uint> {
  static constexpr uint32_t value = 3;
};

enum SimdOperation : uint32_t {
  kSimdSum = 1,
  kSimdMax = 2,
  kSimdShuffle = 3,
  kSimdShuffleXor = 4,
  kSimdShuffleDown = 5,
  kSimdShuffleUp = 6,
};

template <typename T>
inline uint32_t to_bits(T value) {
  uint32_t bits;
  __builtin_memcpy(&bits, &value, 4);
  return bits;
}

template <typename T>
inline T from_bits(uint32_t bits) {
  T value;
  __builtin_memcpy(&value, &bits, 4);
  return value;
}

template <typename T>
inline const uint32_t* exchange(T value, SimdOperation operation) {
  static_assert(sizeof(T) == 4, "SIMD-group operations take float, int or uint only");
  return simd_exchange(to_bits(value), operation * 16u + simd_value_kind<T>::value);
}

inline float maximum(float a, float b) { return __builtin_fmaxf(a, b); }
inline int maximum(int a, int b) { return a > b ? a : b; }
inline uint maximum(uint a, uint b) { return a > b ? a : b; }

}  // namespace metal_emu

// Storage types of MLX's float16_t / bfloat16_t. Only explicit conversion to and from float is
// defined: arithmetic on them is outside the subset.
struct float16_t {
  uint16_t bits;
  float16_t() = default;
  explicit float16_t(float value) : bits(metal_emu::float_to_half_bits(value)) {}
  explicit operator float() const { return metal_emu::half_bits_to_float(bits); }
};

struct bfloat16_t {
  uint16_t bits;
  bfloat16_t() = default;
  explicit bfloat16_t(float value) : bits(metal_emu::float_to_bfloat16_bits(value)) {}
  explicit operator float() const { return metal_emu::bits_float((uint32_t)bits << 16); }
};

#ifndef INFINITY
#define INFINITY (__builtin_inff())
#endif

namespace metal {

enum class mem_flags { mem_none = 0, mem_device = 1, mem_threadgroup = 2, mem_texture = 4 };

inline void threadgroup_barrier(mem_flags) { metal_emu::threadgroup_barrier_wait(); }

// Precise (non-fast) math only; each maps to the correctly rounded or libm function.
inline float exp(float x) { return __builtin_expf(x); }
inline float sqrt(float x) { return __builtin_sqrtf(x); }
inline float fma(float a, float b, float c) { return __builtin_fmaf(a, b, c); }
inline float abs(float x) { return __builtin_fabsf(x); }
inline int abs(int x) { return x < 0 ? -x : x; }
inline float max(float a, float b) { return __builtin_fmaxf(a, b); }
inline int max(int a, int b) { return a > b ? a : b; }
inline uint max(uint a, uint b) { return a > b ? a : b; }
inline float min(float a, float b) { return __builtin_fminf(a, b); }
inline int min(int a, int b) { return a < b ? a : b; }
inline uint min(uint a, uint b) { return a < b ? a : b; }

// Sum over the 32 lanes as a fixed tree: at offsets 16, 8, 4, 2, 1, lane i adds lane i+offset.
template <typename T>
inline T simd_sum(T value) {
  const uint32_t* lanes = metal_emu::exchange(value, metal_emu::kSimdSum);
  T partial[32];
  for (int i = 0; i < 32; ++i) partial[i] = metal_emu::from_bits<T>(lanes[i]);
  for (int offset = 16; offset > 0; offset /= 2) {
    for (int i = 0; i < offset; ++i) partial[i] = partial[i] + partial[i + offset];
  }
  return partial[0];
}

template <typename T>
inline T simd_max(T value) {
  const uint32_t* lanes = metal_emu::exchange(value, metal_emu::kSimdMax);
  T result = metal_emu::from_bits<T>(lanes[0]);
  for (int i = 1; i < 32; ++i) result = metal_emu::maximum(result, metal_emu::from_bits<T>(lanes[i]));
  return result;
}

template <typename T>
inline T simd_shuffle(T value, ushort lane) {
  const uint32_t* lanes = metal_emu::exchange(value, metal_emu::kSimdShuffle);
  if (lane >= 32) metal_emu::fail("simd_shuffle: source lane out of range");
  return metal_emu::from_bits<T>(lanes[lane]);
}

template <typename T>
inline T simd_shuffle_xor(T value, ushort mask) {
  const uint32_t* lanes = metal_emu::exchange(value, metal_emu::kSimdShuffleXor);
  uint source = metal_emu::current_lane() ^ mask;
  if (source >= 32) metal_emu::fail("simd_shuffle_xor: mask leaves the SIMD-group");
  return metal_emu::from_bits<T>(lanes[source]);
}

// Lanes whose source is outside the SIMD-group keep their own value.
template <typename T>
inline T simd_shuffle_down(T value, ushort delta) {
  const uint32_t* lanes = metal_emu::exchange(value, metal_emu::kSimdShuffleDown);
  uint source = metal_emu::current_lane() + delta;
  return source < 32 ? metal_emu::from_bits<T>(lanes[source]) : value;
}

template <typename T>
inline T simd_shuffle_up(T value, ushort delta) {
  const uint32_t* lanes = metal_emu::exchange(value, metal_emu::kSimdShuffleUp);
  uint lane = metal_emu::current_lane();
  return lane >= delta ? metal_emu::from_bits<T>(lanes[lane - delta]) : value;
}

}  // namespace metal

// Address spaces. Device, constant and thread memory are ordinary memory. A threadgroup array
// declared in a kernel body becomes one object shared by every fiber of the running threadgroup;
// volatile keeps the compiler from caching it in registers across a barrier. A threadgroup
// pointer or parameter does not compile (outside the subset).
#ifndef METAL_EMU_RUNTIME
#define device
#define constant
#define thread
#define threadgroup static volatile
#endif

// The shared library's entry point: METAL_EMU_ENTRY(kernel<args>(arguments)) defines
// metal_emu_run, which launches the kernel with buffer i at b[i] and the thread attributes of
// each thread in `attributes`.
#define METAL_EMU_ENTRY(...)                                                                   \
  namespace {                                                                                  \
  void metal_emu_thread(void* context, const metal_emu::ThreadAttributes* attributes) {        \
    void** b = static_cast<void**>(context);                                                   \
    (void)b;                                                                                   \
    (void)attributes;                                                                          \
    __VA_ARGS__;                                                                               \
  }                                                                                            \
  }                                                                                            \
  extern "C" __attribute__((visibility("default"))) int metal_emu_run(                         \
      void** buffers, const uint32_t* grid, const uint32_t* group_size, int reverse_order,     \
      char* error, int error_size) {                                                           \
    return metal_emu::launch(metal_emu_thread, buffers, grid, group_size, reverse_order, error, \
                             error_size);                                                      \
  }

#endif  // EXACTDRAFT_METAL_EMU_H
