#include "text/substrings.h"

#include <algorithm>

namespace ember {

SubstringSet::SubstringSet(std::vector<std::string> strings) : strings_(std::move(strings)) {
  for (size_t i = 0; i < strings_.size(); ++i)
    if (!strings_[i].empty()) sorted_.push_back(static_cast<int32_t>(i));
  std::stable_sort(sorted_.begin(), sorted_.end(), [&](int32_t a, int32_t b) { return strings_[a] < strings_[b]; });
  sorted_.erase(std::unique(sorted_.begin(), sorted_.end(), [&](int32_t a, int32_t b) { return strings_[a] == strings_[b]; }),
                sorted_.end());
}

std::vector<int32_t> SubstringSet::present(std::string_view text) const {
  std::vector<char> seen(strings_.size(), 0);
  std::vector<int32_t> out;
  for (size_t p = 0; p < text.size(); ++p) {
    auto lo = sorted_.begin(), hi = sorted_.end();
    for (size_t d = 0; p + d < text.size() && lo != hi; ++d) {
      const unsigned char c = static_cast<unsigned char>(text[p + d]);
      // strings in [lo, hi) share text[p, p + d); those of length d sort first and are done
      auto byte_at = [&](int32_t i) { return static_cast<unsigned char>(strings_[i][d]); };
      while (lo != hi && strings_[*lo].size() <= d) ++lo;
      lo = std::lower_bound(lo, hi, c, [&](int32_t i, unsigned char v) { return byte_at(i) < v; });
      hi = std::upper_bound(lo, hi, c, [&](unsigned char v, int32_t i) { return v < byte_at(i); });
      if (lo != hi && strings_[*lo].size() == d + 1 && !seen[*lo]) {
        seen[*lo] = 1;
        out.push_back(*lo);
      }
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace ember
