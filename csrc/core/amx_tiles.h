// The AMX tile instructions ember uses, as inline assembly: the assembler knows them whatever
// the compiler flags, and each statement is volatile and says what memory it reads or writes,
// so the compiler can neither drop the tile configuration's stores (GCC 12 does with the
// _tile_loadconfig intrinsic, and the tiles then fault) nor move a tile load before the stores
// it reads or a reload before the tile store it depends on. Only for CPUs on which the OS has
// granted the tile state (cpu_features: amx_granted), or under the emulator (amx_emulator.h).
#pragma once
#include <cstddef>
#include <cstdint>

#include "core/amx_emulator.h"

namespace ember {

// Palette 1: tile t has rows[t] rows of colsb[t] bytes (at most 16 x 64); unused tiles are 0.
struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};

  TileConfig& set(int tile, int n_rows, int row_bytes) {
    rows[tile] = static_cast<uint8_t>(n_rows);
    colsb[tile] = static_cast<uint16_t>(row_bytes);
    return *this;
  }
};
static_assert(sizeof(TileConfig) == 64, "TileConfig is ldtilecfg's 64-byte operand");

inline void tile_load_config(const TileConfig& c) {
  if (amx_emulating.load(std::memory_order_relaxed)) install_amx_emulator();
  __asm__ volatile("ldtilecfg %0" : : "m"(c) : "memory");
}
inline void tile_release() { __asm__ volatile("tilerelease" : : : "memory"); }

template <int T>
inline void tile_zero() {
  __asm__ volatile("tilezero %%tmm%c0" : : "i"(T));
}

// Tile T's rows from p, p + stride, ...
template <int T>
inline void tile_load(const void* p, size_t stride) {
  __asm__ volatile("tileloadd (%0,%1,1), %%tmm%c2" : : "r"(p), "r"(stride), "i"(T) : "memory");
}

template <int T>
inline void tile_store(void* p, size_t stride) {
  __asm__ volatile("tilestored %%tmm%c2, (%0,%1,1)" : : "r"(p), "r"(stride), "i"(T) : "memory");
}

// C += A . B in groups of 4 bytes, int32 sums; A's bytes unsigned, B's signed.
template <int C, int A, int B>
inline void tile_dpbusd() {
  __asm__ volatile("tdpbusd %%tmm%c0, %%tmm%c1, %%tmm%c2" : : "i"(B), "i"(A), "i"(C));
}

// C += A . B in groups of 4 bytes, int32 sums; both operands' bytes signed.
template <int C, int A, int B>
inline void tile_dpbssd() {
  __asm__ volatile("tdpbssd %%tmm%c0, %%tmm%c1, %%tmm%c2" : : "i"(B), "i"(A), "i"(C));
}

// C += A . B with the signedness of each operand chosen at run time ('s' or 'u'): for tests of
// the tile path (native or emulated) against a reference. A: M rows of 4K bytes, B: K rows of
// 4N bytes, C: M rows of N int32, all contiguous; M, K, N at most 16.
void tile_dot_product(char a_sign, char b_sign, int M, int K, int N, const uint8_t* a, const uint8_t* b, int32_t* c);

}  // namespace ember
