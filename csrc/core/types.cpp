#include "core/types.h"

namespace ember {

namespace {
struct TypeTable {
  TypeTraits traits[kTypeCount] = {};
  constexpr TypeTable() {
    set(GGMLType::F32, "F32", 1, 4);
    set(GGMLType::F16, "F16", 1, 2);
    set(GGMLType::BF16, "BF16", 1, 2);
    set(GGMLType::Q4_0, "Q4_0", QK4_0, sizeof(block_q4_0));
    set(GGMLType::Q4_1, "Q4_1", QK4_1, sizeof(block_q4_1));
    set(GGMLType::Q5_0, "Q5_0", QK5_0, sizeof(block_q5_0));
    set(GGMLType::Q5_1, "Q5_1", QK5_1, sizeof(block_q5_1));
    set(GGMLType::Q8_0, "Q8_0", QK8_0, sizeof(block_q8_0));
    set(GGMLType::Q8_1, "Q8_1", QK8_1, sizeof(block_q8_1));
    set(GGMLType::Q2_K, "Q2_K", QK_K, sizeof(block_q2_K));
    set(GGMLType::Q3_K, "Q3_K", QK_K, sizeof(block_q3_K));
    set(GGMLType::Q4_K, "Q4_K", QK_K, sizeof(block_q4_K));
    set(GGMLType::Q5_K, "Q5_K", QK_K, sizeof(block_q5_K));
    set(GGMLType::Q6_K, "Q6_K", QK_K, sizeof(block_q6_K));
    set(GGMLType::Q8_K, "Q8_K", QK_K, sizeof(block_q8_K));
    set(GGMLType::IQ4_NL, "IQ4_NL", QK4_NL, sizeof(block_iq4_nl));
    set(GGMLType::IQ4_XS, "IQ4_XS", QK_K, sizeof(block_iq4_xs));
  }
  constexpr void set(GGMLType t, const char* name, int64_t bs, size_t ts) {
    traits[static_cast<int>(t)] = TypeTraits{name, bs, ts};
  }
};
constexpr TypeTable kTable;
constexpr TypeTraits kUnknown = {nullptr, 0, 0};
}  // namespace

const TypeTraits& type_traits(GGMLType type) {
  int id = static_cast<int>(type);
  return (id >= 0 && id < kTypeCount) ? kTable.traits[id] : kUnknown;
}

bool type_supported(int32_t type_id) {
  return type_id >= 0 && type_id < kTypeCount && kTable.traits[type_id].name != nullptr;
}

size_t row_bytes(GGMLType type, int64_t n) {
  const TypeTraits& t = type_traits(type);
  return static_cast<size_t>(n / t.block_size) * t.type_size;
}

}  // namespace ember
