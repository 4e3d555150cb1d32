#include "text/spm.h"

#include "text/symbols.h"

#include <algorithm>
#include <stdexcept>
#include <utility>

namespace ember {
namespace {

// Bytes of the UTF-8 character that starts with `lead` (a stray continuation byte counts as one).
size_t utf8_length(uint8_t lead) {
  static constexpr uint8_t kLengths[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
  return kLengths[lead >> 4];
}

}  // namespace

SpmVocab::SpmVocab(std::shared_ptr<const TextIndex> tokens, std::vector<float> scores,
                   const std::array<int32_t, 256>& byte_ids)
    : tokens_(std::move(tokens)), scores_(std::move(scores)), byte_ids_(byte_ids) {
  if (scores_.size() != tokens_->size())
    throw std::invalid_argument("SpmVocab: " + std::to_string(scores_.size()) + " scores for " +
                                std::to_string(tokens_->size()) + " tokens");
  for (int32_t id : byte_ids_)
    if (id < 0 || static_cast<size_t>(id) >= tokens_->size()) throw std::invalid_argument("SpmVocab: byte token id out of range");
}

void SpmVocab::encode(std::string_view text, std::vector<int32_t>& out) const {
  std::vector<uint32_t> lengths;
  lengths.reserve(text.size());
  for (size_t at = 0; at < text.size(); at += lengths.back())
    lengths.push_back(static_cast<uint32_t>(std::min(text.size() - at, utf8_length(static_cast<uint8_t>(text[at])))));
  if (lengths.empty()) return;
  std::vector<Symbol> sym = symbol_chain(lengths);
  // SentencePiece merges the highest score first: the key is the negated score
  merge_symbols<float>(sym, [&](int32_t left, int32_t right) -> std::optional<SymbolPair<float>> {
    const uint32_t len = sym[left].len + sym[right].len;
    const int32_t id = tokens_->find(text.substr(sym[left].start, len));
    if (id < 0) return std::nullopt;
    return SymbolPair<float>{-scores_[id], left, right, id, len};
  });

  // Every merged symbol is a token (a pair is only queued when it makes one), so only a single
  // character can be left without a token: it becomes byte tokens.
  for (int32_t i = 0; i >= 0; i = sym[i].next) {
    const std::string_view piece = text.substr(sym[i].start, sym[i].len);
    const int32_t id = sym[i].id >= 0 ? sym[i].id : tokens_->find(piece);
    if (id >= 0) {
      out.push_back(id);
      continue;
    }
    for (unsigned char c : piece) out.push_back(byte_ids_[c]);
  }
}

}  // namespace ember
