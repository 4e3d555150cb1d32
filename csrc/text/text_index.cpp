#include "text/text_index.h"

#include <cstring>
#include <stdexcept>

namespace ember {
namespace {

size_t text_hash(std::string_view t) {  // FNV-1a
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : t) h = (h ^ c) * 0x100000001b3ull;
  return static_cast<size_t>(h ^ (h >> 29));
}

}  // namespace

std::string_view table_element(const StringTable& t, size_t i, const char* what) {
  const int64_t off = t.fields[i];
  if (off < 0 || static_cast<uint64_t>(off) > t.raw_size || t.raw_size - static_cast<size_t>(off) < 8)
    throw std::invalid_argument(std::string(what) + " element " + std::to_string(i) + ": offset outside the array");
  uint64_t len;
  std::memcpy(&len, t.raw + off, 8);
  if (len > t.raw_size - static_cast<size_t>(off) - 8)
    throw std::invalid_argument(std::string(what) + " element " + std::to_string(i) + ": length past the array's end");
  return {reinterpret_cast<const char*>(t.raw) + off + 8, static_cast<size_t>(len)};
}

TextIndex::TextIndex(const StringTable& tokens) {
  if (tokens.count == 0) throw std::invalid_argument("the vocabulary is empty");
  if (tokens.count > 0x7FFFFFFF) throw std::invalid_argument("the vocabulary has too many tokens");
  start_.reserve(tokens.count + 1);
  for (size_t i = 0; i < tokens.count; ++i) {
    const std::string_view t = table_element(tokens, i, "tokenizer.ggml.tokens");
    start_.push_back(static_cast<uint32_t>(pool_.size()));
    if (t.empty())
      pool_ += "[EMPTY_" + std::to_string(i) + "]";
    else
      pool_.append(t.data(), t.size());
    if (pool_.size() > 0xFFFFFFF0u) throw std::invalid_argument("the vocabulary's texts exceed 4 GiB");
  }
  start_.push_back(static_cast<uint32_t>(pool_.size()));

  size_t n = 16;
  while (n < 2 * tokens.count) n *= 2;
  slots_.assign(n, -1);
  for (size_t i = 0; i < tokens.count; ++i) {
    const std::string_view t = text(static_cast<int32_t>(i));
    for (size_t s = text_hash(t) & (n - 1);; s = (s + 1) & (n - 1)) {
      if (slots_[s] < 0 || text(slots_[s]) == t) {
        slots_[s] = static_cast<int32_t>(i);  // a later equal text takes the slot
        break;
      }
    }
  }
}

int32_t TextIndex::find(std::string_view t) const {
  const size_t mask = slots_.size() - 1;
  for (size_t s = text_hash(t) & mask;; s = (s + 1) & mask) {
    const int32_t id = slots_[s];
    if (id < 0 || text(id) == t) return id;
  }
}

}  // namespace ember
