// SentencePiece-style merging ("llama" vocabularies) as llama.cpp's llm_tokenizer_spm runs it on
// one piece of text (spaces already written as U+2581, the space prefix already added): the
// piece's UTF-8 characters are the first symbols; then the adjacent pair whose concatenation is
// the highest-scoring token is merged (ties: the leftmost), until no pair makes a token. A
// symbol left that is no token (a single character) becomes its bytes' tokens (<0xXX>).
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include "text/text_index.h"

namespace ember {

class SpmVocab {
 public:
  // scores: one per token; byte_ids: the token of each byte value (its <0xXX> token, or the
  // fallback the vocabulary defines).
  SpmVocab(std::shared_ptr<const TextIndex> tokens, std::vector<float> scores, const std::array<int32_t, 256>& byte_ids);

  void encode(std::string_view text, std::vector<int32_t>& out) const;

 private:
  std::shared_ptr<const TextIndex> tokens_;
  std::vector<float> scores_;
  std::array<int32_t, 256> byte_ids_;
};

}  // namespace ember
