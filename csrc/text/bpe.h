// Byte-level BPE ("gpt2" vocabularies) as llama.cpp's llm_tokenizer_bpe runs it on one word:
// the word's bytes become GPT-2's printable characters (bytes_to_unicode), each one a symbol;
// then the adjacent pair with the lowest merge rank is merged (ties: the leftmost) until no
// pair has a rank. Ranks belong to pairs of texts, as in llama.cpp: a merge applies whether or
// not its result is a token, and a symbol that is no token can merge further by its text. A
// symbol left that is no token is emitted as the tokens of its single bytes, where those exist.
// With ignore_merges, a word that is itself a token is that token.
//
// Without byte_encode (Gemma 4's "SentencePiece-style" BPE) the symbols are the word's UTF-8
// characters themselves, a symbol left that is no token becomes its bytes' <0xXX> tokens, and a
// word of newlines only that is a token is that token (llama.cpp's Gemma 4 rule).
//
// The merges arrive as a GGUF string array (see text_index.h); merges of two tokens live in an
// open-addressing table keyed by the pair of ids (~2 MB for 50k merges), the rare merges with a
// part that is no token in a map keyed by text.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "text/text_index.h"

namespace ember {

class BpeVocab {
 public:
  BpeVocab(std::shared_ptr<const TextIndex> tokens, const StringTable& merges, bool ignore_merges,
           bool byte_encode = true);

  // Appends the ids of one pre-tokenized word (UTF-8 text, not yet byte-level mapped).
  void encode_word(std::string_view word, std::vector<int32_t>& out) const;
  size_t n_merges() const { return n_merges_; }

 private:
  struct Merge {
    uint64_t key = kEmpty;  // left id << 32 | right id
    int32_t rank = 0;
    int32_t id = -1;  // the merged token, or -1 when its text is not a token
  };
  static constexpr uint64_t kEmpty = ~uint64_t{0};

  int32_t find(std::string_view text) const { return tokens_->find(text); }
  const Merge* merge(int32_t left, int32_t right) const;
  void add_merge(int32_t left, int32_t right, int32_t rank, int32_t id);
  static std::string text_key(std::string_view left, std::string_view right);

  std::shared_ptr<const TextIndex> tokens_;
  std::vector<Merge> merges_;     // power-of-two size, at most half full
  size_t n_merges_ = 0;
  std::unordered_map<std::string, int32_t> text_merges_;  // text_key -> rank, a part no token
  std::string byte_char_[256];    // bytes_to_unicode, as UTF-8
  int32_t byte_id_[256];          // the token of each byte's character, or -1
  int32_t hex_byte_id_[256];      // the <0xXX> token of each byte, or -1 (without byte_encode)
  bool ignore_merges_;
  bool byte_encode_;
};

}  // namespace ember
