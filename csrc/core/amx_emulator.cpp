#include "core/amx_emulator.h"

#if defined(__linux__) && defined(__x86_64__)
#include <signal.h>
#include <sys/syscall.h>
#include <ucontext.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <mutex>

namespace ember {

namespace {

constexpr int kTiles = 8, kMaxRows = 16, kMaxRowBytes = 64;

// One thread's tile state. The handler runs on the faulting thread; the states live in a fixed
// table (nothing in a signal handler may allocate), claimed by thread id on the first
// ldtilecfg and given back by tilerelease.
struct TileState {
  std::atomic<long> owner{0};
  bool configured = false;
  uint8_t rows[kTiles] = {};
  uint16_t colsb[kTiles] = {};
  alignas(64) uint8_t data[kTiles][kMaxRows][kMaxRowBytes] = {};
};

constexpr int kSlots = 128;
TileState g_states[kSlots];
struct sigaction g_previous;

[[noreturn]] void fail(const char* what) {
  static const char prefix[] = "ember AMX emulator: ";
  ssize_t ignored = write(2, prefix, sizeof prefix - 1);
  ignored = write(2, what, strlen(what));
  ignored = write(2, "\n", 1);
  (void)ignored;
  abort();
}

TileState* find_state(bool claim) {
  const long tid = syscall(SYS_gettid);
  for (TileState& s : g_states)
    if (s.owner.load(std::memory_order_acquire) == tid) return &s;
  if (!claim) return nullptr;
  for (TileState& s : g_states) {
    long free = 0;
    if (s.owner.compare_exchange_strong(free, tid)) return &s;
  }
  fail("more threads hold tile state than the emulator has room for");
}

// An instruction's fields: VEX.128.pp.0F38.W0 opcode, ModRM, and the memory operand if any.
struct Insn {
  int pp = 0, opcode = 0, mod = 0, reg = 0, rm = 0, vvvv = 0, length = 0;
  bool sib = false;
  uint64_t address = 0;  // base + displacement (+ index << scale, except for the tile loads and stores)
  uint64_t stride = 0;   // tile loads and stores: index << scale
};

uint64_t greg(const mcontext_t& m, int r) {
  static const int kIndex[16] = {REG_RAX, REG_RCX, REG_RDX, REG_RBX, REG_RSP, REG_RBP, REG_RSI, REG_RDI,
                                 REG_R8,  REG_R9,  REG_R10, REG_R11, REG_R12, REG_R13, REG_R14, REG_R15};
  return static_cast<uint64_t>(m.gregs[kIndex[r]]);
}

// Decodes the tile instructions' encodings (three-byte VEX, map 0F38, opcodes 49, 4B, 5E).
bool decode(const uint8_t* p, const mcontext_t& m, Insn& in) {
  if (p[0] != 0xC4 || (p[1] & 0x1F) != 0x02 || (p[2] & 0x84) != 0) return false;  // C4, map 0F38, W0, L0
  const bool rex_r = !(p[1] & 0x80), rex_x = !(p[1] & 0x40), rex_b = !(p[1] & 0x20);
  in.vvvv = (~p[2] >> 3) & 0xF;
  in.pp = p[2] & 3;
  in.opcode = p[3];
  if (in.opcode != 0x49 && in.opcode != 0x4B && in.opcode != 0x5E) return false;
  const uint8_t modrm = p[4];
  in.mod = modrm >> 6;
  in.reg = ((modrm >> 3) & 7) | (rex_r << 3);
  in.rm = (modrm & 7) | (rex_b << 3);
  in.length = 5;
  if (in.mod == 3) return true;
  uint64_t base = 0, index = 0;
  int scale = 0;
  bool disp32 = in.mod == 2, rip = false;
  if ((modrm & 7) == 4) {
    in.sib = true;
    const uint8_t sib = p[in.length++];
    scale = sib >> 6;
    const int idx = ((sib >> 3) & 7) | (rex_x << 3);
    if (idx != 4) index = greg(m, idx);
    if ((sib & 7) == 5 && in.mod == 0) disp32 = true;
    else base = greg(m, (sib & 7) | (rex_b << 3));
  } else if ((modrm & 7) == 5 && in.mod == 0) {
    rip = disp32 = true;
  } else {
    base = greg(m, in.rm);
  }
  int64_t disp = 0;
  if (in.mod == 1) {
    disp = static_cast<int8_t>(p[in.length++]);
  } else if (disp32) {
    int32_t d;
    std::memcpy(&d, p + in.length, 4);
    in.length += 4;
    disp = d;
  }
  if (rip) base = reinterpret_cast<uint64_t>(p) + in.length;
  in.stride = index << scale;
  in.address = base + static_cast<uint64_t>(disp);
  return true;
}

// A tile an instruction names: it must exist and be configured (#UD otherwise).
int tile(const TileState* s, int t, const char* what) {
  if (!s || !s->configured) fail("a tile instruction ran before ldtilecfg");
  if (t >= kTiles || s->rows[t] == 0 || s->colsb[t] == 0) fail(what);
  return t;
}

void load_config(const uint8_t* cfg) {
  if (cfg[0] == 0) {  // palette 0: the initial state
    if (TileState* s = find_state(false)) s->configured = false, s->owner.store(0, std::memory_order_release);
    return;
  }
  if (cfg[0] != 1) fail("ldtilecfg: palette other than 0 or 1");
  if (cfg[1] != 0) fail("ldtilecfg: start_row is not 0");
  for (int i = 2; i < 16; ++i)
    if (cfg[i]) fail("ldtilecfg: reserved bytes are not 0");
  uint16_t colsb[16];
  std::memcpy(colsb, cfg + 16, sizeof colsb);
  const uint8_t* rows = cfg + 48;
  for (int t = 0; t < 16; ++t) {
    if (t >= kTiles && (rows[t] || colsb[t])) fail("ldtilecfg: palette 1 has 8 tiles");
    if (rows[t] > kMaxRows || colsb[t] > kMaxRowBytes) fail("ldtilecfg: tile larger than 16 rows of 64 bytes");
    if ((rows[t] == 0) != (colsb[t] == 0)) fail("ldtilecfg: a tile with rows but no columns or the reverse");
  }
  TileState* s = find_state(true);
  std::memset(s->data, 0, sizeof s->data);
  for (int t = 0; t < kTiles; ++t) s->rows[t] = rows[t], s->colsb[t] = colsb[t];
  s->configured = true;
}

void store_config(uint8_t* cfg) {
  std::memset(cfg, 0, 64);
  const TileState* s = find_state(false);
  if (!s || !s->configured) return;
  cfg[0] = 1;
  for (int t = 0; t < kTiles; ++t) {
    std::memcpy(cfg + 16 + 2 * t, &s->colsb[t], 2);
    cfg[48 + t] = s->rows[t];
  }
}

// dst += src1 . src2 by groups of 4 bytes: dst[m][n] += sum_k sum_i src1[m][4k + i] src2[k][4n + i],
// the bytes signed or unsigned as the variant says, sums wrapping at 32 bits.
void dot_product(TileState* s, int dst, int src1, int src2, bool signed1, bool signed2) {
  tile(s, dst, "tdpb*d: destination tile not configured");
  tile(s, src1, "tdpb*d: first source tile not configured");
  tile(s, src2, "tdpb*d: second source tile not configured");
  if (dst == src1 || dst == src2 || src1 == src2) fail("tdpb*d: the three tiles must differ");
  const int M = s->rows[dst], N = s->colsb[dst] / 4, K = s->colsb[src1] / 4;
  if (s->colsb[dst] % 4 || s->colsb[src1] % 4 || s->rows[src1] != M || s->rows[src2] != K ||
      s->colsb[src2] != s->colsb[dst])
    fail("tdpb*d: tile shapes do not match (C rows = A rows, A bytes = 4 B rows, C bytes = B bytes)");
  auto byte = [](const uint8_t* row, int i, bool sign) { return sign ? int32_t(int8_t(row[i])) : int32_t(row[i]); };
  for (int m = 0; m < M; ++m) {
    uint8_t* c = s->data[dst][m];
    for (int n = 0; n < N; ++n) {
      uint32_t acc;
      std::memcpy(&acc, c + 4 * n, 4);
      for (int k = 0; k < K; ++k)
        for (int i = 0; i < 4; ++i)
          acc += static_cast<uint32_t>(byte(s->data[src1][m], 4 * k + i, signed1) *
                                       byte(s->data[src2][k], 4 * n + i, signed2));
      std::memcpy(c + 4 * n, &acc, 4);
    }
  }
}

// Carries out one decoded instruction; false if it is not a tile instruction.
bool execute(const Insn& in) {
  if (in.opcode == 0x49) {
    if (in.mod != 3 && (in.reg & 7) == 0 && in.pp == 0) return load_config(reinterpret_cast<const uint8_t*>(in.address)), true;
    if (in.mod != 3 && (in.reg & 7) == 0 && in.pp == 1) return store_config(reinterpret_cast<uint8_t*>(in.address)), true;
    if (in.mod == 3 && in.reg == 0 && in.rm == 0 && in.pp == 0) {  // tilerelease
      if (TileState* s = find_state(false)) s->configured = false, s->owner.store(0, std::memory_order_release);
      return true;
    }
    if (in.mod == 3 && in.rm == 0 && in.pp == 3) {  // tilezero
      TileState* s = find_state(false);
      std::memset(s->data[tile(s, in.reg, "tilezero: tile not configured")], 0, sizeof s->data[0]);
      return true;
    }
    return false;
  }
  if (in.opcode == 0x4B) {
    if (in.mod == 3 || !in.sib || in.pp == 0) return false;
    TileState* s = find_state(false);
    const int t = tile(s, in.reg, "tileloadd / tilestored: tile not configured");
    if (in.pp == 2) {  // tilestored
      for (int r = 0; r < s->rows[t]; ++r)
        std::memcpy(reinterpret_cast<uint8_t*>(in.address + r * in.stride), s->data[t][r], s->colsb[t]);
    } else {  // tileloadd (pp 3), tileloaddt1 (pp 1): rows and bytes past the configuration read as 0
      std::memset(s->data[t], 0, sizeof s->data[t]);
      for (int r = 0; r < s->rows[t]; ++r)
        std::memcpy(s->data[t][r], reinterpret_cast<const uint8_t*>(in.address + r * in.stride), s->colsb[t]);
    }
    return true;
  }
  if (in.mod != 3) return false;  // 5E: tdpbuud (pp 0), tdpbusd (1), tdpbsud (2), tdpbssd (3)
  dot_product(find_state(false), in.reg, in.rm, in.vvvv, in.pp >= 2, in.pp & 1);
  return true;
}

void on_sigill(int, siginfo_t*, void* context) {
  ucontext_t* uc = static_cast<ucontext_t*>(context);
  const uint8_t* pc = reinterpret_cast<const uint8_t*>(uc->uc_mcontext.gregs[REG_RIP]);
  Insn in;
  if (decode(pc, uc->uc_mcontext, in) && execute(in)) {
    uc->uc_mcontext.gregs[REG_RIP] += in.length;
    return;
  }
  // Not a tile instruction: back to the handler before ours, which gets the signal when the
  // instruction runs again.
  sigaction(SIGILL, &g_previous, nullptr);
}

}  // namespace

std::atomic<bool> amx_emulating{false};

bool install_amx_emulator() {
  static std::mutex installing;  // two threads must not both save the other's handler as previous
  std::lock_guard<std::mutex> lock(installing);
  struct sigaction current;
  if (sigaction(SIGILL, nullptr, &current) != 0) return false;
  if ((current.sa_flags & SA_SIGINFO) && current.sa_sigaction == on_sigill) return true;
  struct sigaction sa;
  std::memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = on_sigill;
  sa.sa_flags = SA_SIGINFO;
  sigemptyset(&sa.sa_mask);
  if (sigaction(SIGILL, &sa, &g_previous) != 0) return false;
  amx_emulating.store(true, std::memory_order_relaxed);
  return true;
}

}  // namespace ember

#else

namespace ember {
std::atomic<bool> amx_emulating{false};
bool install_amx_emulator() { return false; }
}  // namespace ember

#endif
