#include "text/bpe.h"

#include "text/symbols.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <utility>

namespace ember {
namespace {

void append_utf8(std::string& s, uint32_t cp) {
  if (cp < 0x80) {
    s += static_cast<char>(cp);
  } else {  // bytes_to_unicode only reaches U+0143
    s += static_cast<char>(0xC0 | (cp >> 6));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

uint64_t pair_key(int32_t left, int32_t right) {
  return static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32 | static_cast<uint32_t>(right);
}

size_t slot_of(uint64_t key, size_t mask) { return static_cast<size_t>((key * 0x9E3779B97F4A7C15ull) >> 17) & mask; }

}  // namespace

BpeVocab::BpeVocab(std::shared_ptr<const TextIndex> tokens, const StringTable& merges, bool ignore_merges,
                   bool byte_encode)
    : tokens_(std::move(tokens)), ignore_merges_(ignore_merges), byte_encode_(byte_encode) {
  // GPT-2's bytes_to_unicode: printable Latin-1 bytes stand for themselves, the others in
  // order for U+0100, U+0101, ...
  uint32_t next = 256;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
    append_utf8(byte_char_[b], printable ? static_cast<uint32_t>(b) : next++);
    byte_id_[b] = find(byte_char_[b]);
    static const char* hex = "0123456789ABCDEF";
    const char name[6] = {'<', '0', 'x', hex[b >> 4], hex[b & 15], '>'};
    hex_byte_id_[b] = find(std::string_view(name, 6));
  }

  size_t capacity = 16;
  while (capacity < 2 * merges.count) capacity *= 2;
  merges_.assign(capacity, Merge{});
  std::string joined;
  for (size_t i = 0; i < merges.count; ++i) {
    // "left right", cut at the first space after the first byte, as llama.cpp does
    std::string_view m = table_element(merges, i, "tokenizer.ggml.merges");
    const size_t cut = m.find(' ', 1);
    if (cut == std::string_view::npos) continue;
    std::string_view left = m.substr(0, cut), right = m.substr(cut + 1);
    const int32_t l = find(left), r = find(right);
    const int32_t rank = static_cast<int32_t>(std::min<size_t>(i, 0x7FFFFFFF));
    if (l < 0 || r < 0) {  // only a merged symbol that is no token can use it
      text_merges_.emplace(text_key(left, right), rank);
      continue;
    }
    joined.assign(left);
    joined.append(right);
    add_merge(l, r, rank, find(joined));
  }
}

std::string BpeVocab::text_key(std::string_view left, std::string_view right) {
  std::string key;
  const uint32_t n = static_cast<uint32_t>(left.size());
  key.append(reinterpret_cast<const char*>(&n), sizeof n);
  key.append(left);
  key.append(right);
  return key;
}

void BpeVocab::add_merge(int32_t left, int32_t right, int32_t rank, int32_t id) {
  const uint64_t key = pair_key(left, right);
  const size_t mask = merges_.size() - 1;
  for (size_t s = slot_of(key, mask);; s = (s + 1) & mask) {
    if (merges_[s].key == key) return;  // the first rank of a pair stands
    if (merges_[s].key == kEmpty) {
      merges_[s] = Merge{key, rank, id};
      ++n_merges_;
      return;
    }
  }
}

const BpeVocab::Merge* BpeVocab::merge(int32_t left, int32_t right) const {
  if (left < 0 || right < 0) return nullptr;
  const uint64_t key = pair_key(left, right);
  const size_t mask = merges_.size() - 1;
  for (size_t s = slot_of(key, mask);; s = (s + 1) & mask) {
    if (merges_[s].key == key) return &merges_[s];
    if (merges_[s].key == kEmpty) return nullptr;
  }
}

void BpeVocab::encode_word(std::string_view word, std::vector<int32_t>& out) const {
  if (word.empty()) return;
  std::string mapped;
  std::vector<uint32_t> lengths;
  if (byte_encode_) {
    mapped.reserve(word.size() * 2);
    lengths.resize(word.size());
    for (size_t i = 0; i < word.size(); ++i) {
      const uint8_t b = static_cast<uint8_t>(word[i]);
      lengths[i] = static_cast<uint32_t>(byte_char_[b].size());
      mapped += byte_char_[b];
    }
  } else {  // the characters themselves (a truncated last one as what is left of it)
    mapped.assign(word);
    for (size_t at = 0; at < word.size();) {
      const uint8_t lead = static_cast<uint8_t>(word[at]);
      const size_t n = lead < 0x80 ? 1 : lead < 0xE0 ? 2 : lead < 0xF0 ? 3 : 4;
      lengths.push_back(static_cast<uint32_t>(std::min(n, word.size() - at)));
      at += lengths.back();
    }
  }
  const bool newlines_only = !byte_encode_ && word.find_first_not_of('\n') == std::string_view::npos;
  if (ignore_merges_ || newlines_only) {
    const int32_t whole = find(mapped);
    if (whole >= 0) {
      out.push_back(whole);
      return;
    }
  }
  std::vector<Symbol> sym = symbol_chain(lengths);
  for (size_t i = 0; i < sym.size(); ++i)
    sym[i].id = byte_encode_ ? byte_id_[static_cast<uint8_t>(word[i])]
                             : find(std::string_view(mapped.data() + sym[i].start, sym[i].len));

  auto span = [&](const Symbol& s) { return std::string_view(mapped.data() + s.start, s.len); };
  merge_symbols<int32_t>(sym, [&](int32_t left, int32_t right) -> std::optional<SymbolPair<int32_t>> {
    const Symbol& l = sym[left];
    const Symbol& r = sym[right];
    if (l.id >= 0 && r.id >= 0) {
      if (const Merge* m = merge(l.id, r.id)) return SymbolPair<int32_t>{m->rank, left, right, m->id, l.len + r.len};
    } else if (!text_merges_.empty()) {
      auto it = text_merges_.find(text_key(span(l), span(r)));
      if (it != text_merges_.end())
        return SymbolPair<int32_t>{it->second, left, right, find(std::string_view(mapped.data() + l.start, l.len + r.len)),
                                   l.len + r.len};
    }
    return std::nullopt;
  });

  for (int32_t i = 0; i >= 0; i = sym[i].next) {
    const Symbol& s = sym[i];
    if (s.id >= 0) {
      out.push_back(s.id);
      continue;
    }
    for (uint32_t k = 0; k < s.len; ++k) {  // no such token: its single bytes, where they are tokens
      const int32_t id = byte_encode_ ? find(std::string_view(mapped.data() + s.start + k, 1))
                                      : hex_byte_id_[static_cast<uint8_t>(mapped[s.start + k])];
      if (id >= 0) out.push_back(id);
    }
  }
}

}  // namespace ember
