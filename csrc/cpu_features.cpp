#include "cpu_features.h"

#include "core/amx_emulator.h"

#include <algorithm>
#include <cpuid.h>
#include <iterator>
#include <cstdlib>
#include <stdexcept>
#include <unistd.h>
#include <sys/syscall.h>

namespace ember {

namespace {

// Every table's name, in order of preference (best last).
constexpr const char* kIsas[] = {"scalar", "avx2", "avxvnni", "avx512", "amx"};

uint64_t xgetbv0() {
  uint32_t eax, edx;
  __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
  return (static_cast<uint64_t>(edx) << 32) | eax;
}

// Linux: a process must ask for the AMX tile data state before touching the tiles.
bool request_amx_permission() {
#if defined(__linux__)
  constexpr int kArchReqXcompPerm = 0x1023;
  constexpr int kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
#else
  return false;
#endif
}

CpuFeatures detect() {
  CpuFeatures f;
  uint32_t a, b, c, d;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return f;
  const bool osxsave = c & (1u << 27);
  f.fma = c & (1u << 12);
  f.f16c = c & (1u << 29);
  if (!osxsave) return f;
  const uint64_t xcr0 = xgetbv0();
  const bool os_avx = (xcr0 & 0x6) == 0x6;
  const bool os_avx512 = (xcr0 & 0xE6) == 0xE6;
  const bool os_amx = (xcr0 & (3u << 17)) == (3u << 17);
  if (__get_cpuid_max(0, nullptr) < 7) return f;
  __cpuid_count(7, 0, a, b, c, d);
  f.avx2 = os_avx && (b & (1u << 5)) && f.fma && f.f16c;
  f.avx512f = os_avx512 && (b & (1u << 16));
  f.avx512dq = f.avx512f && (b & (1u << 17));
  f.avx512bw = f.avx512f && (b & (1u << 30));
  f.avx512vl = f.avx512f && (b & (1u << 31));
  f.avx512vnni = f.avx512f && (c & (1u << 11));
  f.amx_bf16 = os_amx && (d & (1u << 22));
  f.amx_tile = os_amx && (d & (1u << 24));
  f.amx_int8 = os_amx && (d & (1u << 25));
  __cpuid_count(7, 1, a, b, c, d);
  f.avx_vnni = os_avx && (a & (1u << 4));
  f.avx512bf16 = f.avx512f && (a & (1u << 5));
  if (f.amx_tile && f.amx_int8) f.amx_granted = request_amx_permission();
  const char* emulate = std::getenv("EMBER_EMULATE_AMX");
  if (!f.amx_granted && emulate && std::string(emulate) == "1") f.amx_emulated = install_amx_emulator();
  return f;
}

// Whether this build compiled the table of a name in kIsas (avxvnni needs a compiler with -mavxvnni).
bool built(const std::string& isa) {
#if defined(EMBER_HAS_AVXVNNI_TABLE)
  return true;
#else
  return isa != "avxvnni";
#endif
}

bool supports(const std::string& isa, const CpuFeatures& f) {
  if (!built(isa)) return false;
  if (isa == "scalar") return true;
  if (isa == "avx2") return f.avx2;
  if (isa == "avxvnni") return f.avx2 && f.avx_vnni;
  const bool avx512 = f.avx2 && f.avx512f && f.avx512bw && f.avx512vl && f.avx512dq && f.avx512vnni && f.avx512bf16;
  if (isa == "avx512") return avx512;
  if (isa == "amx") return avx512 && ((f.amx_tile && f.amx_int8 && f.amx_granted) || f.amx_emulated);
  return false;
}

KernelTable make_table(void (*fill)(KernelTable&)) {
  KernelTable t;
  fill(t);
  return t;
}

const KernelTable& table_for(const std::string& isa) {
  static const KernelTable scalar_table = make_table(scalar::register_kernels);
  static const KernelTable avx2_table = make_table(avx2::register_kernels);
  static const KernelTable avx512_table = make_table(avx512::register_kernels);
  static const KernelTable amx_table = make_table(amx::register_kernels);
  if (isa == "avx2") return avx2_table;
#if defined(EMBER_HAS_AVXVNNI_TABLE)
  static const KernelTable avxvnni_table = make_table(avxvnni::register_kernels);
  if (isa == "avxvnni") return avxvnni_table;
#endif
  if (isa == "avx512") return avx512_table;
  if (isa == "amx") return amx_table;
  return scalar_table;
}

std::string default_isa() {
  const char* forced = std::getenv("EMBER_ISA");
  if (forced && *forced) return forced;
  std::vector<std::string> isas = available_isas();
  if (cpu_features().amx_emulated && isas.back() == "amx") isas.pop_back();  // emulated: for tests only
  return isas.back();
}

const KernelTable* g_active = nullptr;

}  // namespace

const CpuFeatures& cpu_features() {
  static const CpuFeatures f = detect();
  return f;
}

std::vector<std::string> built_isas() {
  std::vector<std::string> out;
  for (const char* isa : kIsas)
    if (built(isa)) out.push_back(isa);
  return out;
}

std::vector<std::string> available_isas() {
  std::vector<std::string> out;
  for (const char* isa : kIsas)
    if (supports(isa, cpu_features())) out.push_back(isa);
  return out;
}

// kIsas as prose: "scalar, avx2, ... or amx".
std::string isa_names() {
  constexpr size_t n = std::size(kIsas);
  std::string out;
  for (size_t i = 0; i < n; ++i) {
    if (i) out += i + 1 == n ? " or " : ", ";
    out += kIsas[i];
  }
  return out;
}

void set_active_isa(const std::string& isa) {
  if (std::find(std::begin(kIsas), std::end(kIsas), isa) == std::end(kIsas))
    throw std::invalid_argument("unknown ISA '" + isa + "' (expected " + isa_names() + ")");
  if (!built(isa))
    throw std::invalid_argument("this build of ember has no '" + isa + "' table (its compiler lacks -m" + isa + ")");
  if (!supports(isa, cpu_features()))
    throw std::invalid_argument("this CPU (or OS) does not support ISA '" + isa + "'");
  g_active = &table_for(isa);
}

const KernelTable& active_kernels() {
  if (!g_active) {
    try {
      set_active_isa(default_isa());
    } catch (const std::invalid_argument& e) {
      throw std::invalid_argument(std::string("EMBER_ISA: ") + e.what());
    }
  }
  return *g_active;
}

}  // namespace ember
