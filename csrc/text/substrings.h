// Which of a set of strings occur in a text: the strings sorted, and at each position of the
// text the range of those that match so far narrowed byte by byte (a trie walked over the sorted
// array), so a text is scanned once whatever the number of strings. For the special tokens that
// cut a text before it is tokenized (Gemma 3 has ~6,000).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace ember {

class SubstringSet {
 public:
  explicit SubstringSet(std::vector<std::string> strings);

  // The indices (into the strings given) of those that occur in `text`, each once, ascending.
  std::vector<int32_t> present(std::string_view text) const;

 private:
  std::vector<std::string> strings_;
  std::vector<int32_t> sorted_;  // indices, by string; of equal strings the first
};

}  // namespace ember
