// The texts of a vocabulary and the id of each text: one pool of bytes and an open-addressing
// index by hash (~8 bytes a token beyond the texts). Built from a GGUF string array (u64 length,
// then the bytes, per element) and the offset of each element's length field; every offset and
// length is checked against the buffer before it is used.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace ember {

struct StringTable {
  const uint8_t* raw = nullptr;  // the array body
  size_t raw_size = 0;
  const int64_t* fields = nullptr;  // offset of each element's length field in raw
  size_t count = 0;
};

// Element i of a table, bounds-checked; `what` names the array in the error.
std::string_view table_element(const StringTable& t, size_t i, const char* what);

class TextIndex {
 public:
  // Empty texts are named "[EMPTY_<id>]", as llama.cpp does; of equal texts the last id is found.
  explicit TextIndex(const StringTable& tokens);

  int32_t find(std::string_view text) const;  // -1 when no token has this text
  std::string_view text(int32_t id) const { return {pool_.data() + start_[id], start_[id + 1] - start_[id]}; }
  size_t size() const { return start_.size() - 1; }

 private:
  std::string pool_;
  std::vector<uint32_t> start_;  // token i is pool_[start_[i], start_[i + 1])
  std::vector<int32_t> slots_;   // ids by hash of their text, -1 empty, at most half full
};

}  // namespace ember
