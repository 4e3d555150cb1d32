// The symbols of a word as a linked list, merged pair by pair in order of priority, as
// llama.cpp's BPE and SentencePiece tokenizers both do (their work queues of bigrams): the best
// pair is merged, the pairs it forms with its neighbours are offered, and a queued pair whose
// symbols changed since is stale and skipped.
#pragma once

#include <cstdint>
#include <optional>
#include <queue>
#include <vector>

namespace ember {

struct Symbol {
  uint32_t start, len;  // bytes of the word's text
  int32_t prev, next;   // -1 at the ends
  int32_t id;           // the symbol's token, -1 when unknown or none
};

// Symbols over consecutive pieces of `lengths` bytes each.
inline std::vector<Symbol> symbol_chain(const std::vector<uint32_t>& lengths) {
  std::vector<Symbol> sym(lengths.size());
  uint32_t at = 0;
  for (size_t i = 0; i < lengths.size(); ++i) {
    sym[i] = Symbol{at, lengths[i], static_cast<int32_t>(i) - 1, i + 1 < lengths.size() ? static_cast<int32_t>(i + 1) : -1, -1};
    at += lengths[i];
  }
  return sym;
}

// A candidate merge: the pair's priority lives in Key (smaller merges first, ties: the
// leftmost); id is the merged symbol's token (-1: none).
template <typename Key>
struct SymbolPair {
  Key key;
  int32_t left, right, id;
  uint32_t len;  // of the two symbols together when queued
};

// Merges until no pair is offered: pair(left, right) returns the candidate for two adjacent
// symbols, or nothing when they do not merge.
template <typename Key, typename PairOf>
void merge_symbols(std::vector<Symbol>& sym, PairOf pair) {
  using Pair = SymbolPair<Key>;
  auto later = [](const Pair& a, const Pair& b) { return b.key < a.key || (!(a.key < b.key) && a.left > b.left); };
  std::priority_queue<Pair, std::vector<Pair>, decltype(later)> queue(later);
  auto offer = [&](int32_t left, int32_t right) {
    if (left < 0 || right < 0) return;
    if (std::optional<Pair> p = pair(left, right)) queue.push(*p);
  };
  for (size_t i = 1; i < sym.size(); ++i) offer(static_cast<int32_t>(i - 1), static_cast<int32_t>(i));
  while (!queue.empty()) {
    const Pair p = queue.top();
    queue.pop();
    Symbol& l = sym[p.left];
    Symbol& r = sym[p.right];
    if (l.len == 0 || r.len == 0 || l.next != p.right || l.len + r.len != p.len) continue;
    l.id = p.id;
    l.len += r.len;
    r.len = 0;
    l.next = r.next;
    if (r.next >= 0) sym[r.next].prev = p.left;
    offer(l.prev, p.left);
    offer(p.left, l.next);
  }
}

}  // namespace ember
