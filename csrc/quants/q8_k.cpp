// Q8_K: the activation format for the K-quants. 256 values per block, one float scale,
// q = round(x / d) with d = max|x| / 127 taken with the sign of the extreme value (ggml's
// quantize_row_q8_K_ref, so -128 is reachable), and bsums[i] = sum of q[16 i .. 16 i + 15].
#include <cmath>

#include "core/kernels.h"
#include "quants/x86/avx512_k_panel.h"

namespace ember {
namespace EMBER_ISA_NS {

namespace {

void quantize_row_q8_k(const float* src, void* dst, int64_t n) {
  block_q8_K* y = static_cast<block_q8_K*>(dst);
  for (int64_t b = 0; b < n / QK_K; ++b) {
    const float* x = src + b * QK_K;
    float max = 0.0f, amax = 0.0f;
    for (int j = 0; j < QK_K; ++j) {
      const float ax = std::fabs(x[j]);
      if (ax > amax) amax = ax, max = x[j];
    }
    if (amax == 0.0f) {
      y[b] = block_q8_K{};
      continue;
    }
    const float iscale = -127.0f / max;
    for (int j = 0; j < QK_K; ++j) {
      const int v = static_cast<int>(std::nearbyint(iscale * x[j]));
      y[b].qs[j] = static_cast<int8_t>(v > 127 ? 127 : v);
    }
    for (int j = 0; j < QK_K / 16; ++j) {
      int sum = 0;
      for (int i = 0; i < 16; ++i) sum += y[b].qs[j * 16 + i];
      y[b].bsums[j] = static_cast<int16_t>(sum);
    }
    y[b].d = 1.0f / iscale;
  }
}

void dequantize_row_q8_k(const void* src, float* dst, int64_t n) {
  const block_q8_K* x = static_cast<const block_q8_K*>(src);
  for (int64_t b = 0; b < n / QK_K; ++b)
    for (int j = 0; j < QK_K; ++j) dst[b * QK_K + j] = x[b].d * x[b].qs[j];
}

}  // namespace

void register_q8_k(KernelTable& t) {
  t.types[static_cast<int>(GGMLType::Q8_K)] = {GGMLType::Q8_K, dequantize_row_q8_k, quantize_row_q8_k, nullptr};
#if defined(EMBER_HAS_K_PANELS)
  t.types[static_cast<int>(GGMLType::Q8_K)].pack_panel = pack_panel_k;
#endif
}

}  // namespace EMBER_ISA_NS
}  // namespace ember
