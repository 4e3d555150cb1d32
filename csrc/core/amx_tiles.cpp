#include "core/amx_tiles.h"

#include <stdexcept>

namespace ember {

void tile_dot_product(char a_sign, char b_sign, int M, int K, int N, const uint8_t* a, const uint8_t* b, int32_t* c) {
  if (M < 1 || M > 16 || K < 1 || K > 16 || N < 1 || N > 16)
    throw std::invalid_argument("tile_dot_product: M, K and N must be 1 .. 16");
  TileConfig cfg;
  cfg.set(0, M, 4 * K).set(1, K, 4 * N).set(2, M, 4 * N);
  tile_load_config(cfg);
  tile_load<0>(a, 4 * K);
  tile_load<1>(b, 4 * N);
  tile_load<2>(c, 4 * N);
  if (a_sign == 's' && b_sign == 's') __asm__ volatile("tdpbssd %tmm1, %tmm0, %tmm2");
  else if (a_sign == 's') __asm__ volatile("tdpbsud %tmm1, %tmm0, %tmm2");
  else if (b_sign == 's') __asm__ volatile("tdpbusd %tmm1, %tmm0, %tmm2");
  else __asm__ volatile("tdpbuud %tmm1, %tmm0, %tmm2");
  tile_store<2>(c, 4 * N);
  tile_release();
}

}  // namespace ember
