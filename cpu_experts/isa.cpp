#include "cpu_experts/isa.h"

#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <array>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "core/error.h"

namespace tandem::cpu {

namespace {

struct Regs {
  unsigned a = 0, b = 0, c = 0, d = 0;
};

Regs cpuid(unsigned leaf, unsigned sub) {
  Regs r;
  if (!__get_cpuid_count(leaf, sub, &r.a, &r.b, &r.c, &r.d)) r = Regs{};
  return r;
}

// XCR0 through xgetbv (only valid once OSXSAVE is set); encoded bytes so no -mxsave is needed.
uint64_t xcr0() {
  uint32_t lo, hi;
  __asm__ volatile(".byte 0x0f, 0x01, 0xd0" : "=a"(lo), "=d"(hi) : "c"(0));
  return (static_cast<uint64_t>(hi) << 32) | lo;
}

bool bit(unsigned v, int i) { return (v >> i) & 1u; }

// Linux gates AMX tile data per process (XFD); ask once. Returns an empty string on success.
std::string request_amx_permission() {
  constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  if (syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) != 0)
    return str_cat("Linux refused AMX tile data (arch_prctl ARCH_REQ_XCOMP_PERM: ", std::strerror(errno),
                   "; needs kernel 5.16+)");
  return {};
}

CpuFeatures detect() {
  CpuFeatures f;
  char brand[49] = {};
  for (unsigned i = 0; i < 3; ++i) {
    Regs r = cpuid(0x80000002u + i, 0);
    std::memcpy(brand + 16 * i, &r, 16);
  }
  f.brand = brand;
  while (!f.brand.empty() && f.brand.front() == ' ') f.brand.erase(f.brand.begin());

  const Regs l1 = cpuid(1, 0), l7 = cpuid(7, 0), l71 = cpuid(7, 1);
  const bool osxsave = bit(l1.c, 27);
  const uint64_t x = osxsave ? xcr0() : 0;
  f.avx_vnni = bit(l71.a, 4);
  f.avx512_bf16 = bit(l71.a, 5);

  std::string miss;
  auto need = [&](bool ok, const char* what) {
    if (!ok) miss += miss.empty() ? what : std::string(", ") + what;
  };
  need(osxsave && (x & 0x6) == 0x6, "OS-enabled AVX state (XCR0 bits 1-2)");
  need(bit(l1.c, 28), "AVX");
  need(bit(l7.b, 5), "AVX2");
  need(bit(l1.c, 12), "FMA");
  need(bit(l1.c, 29), "F16C");
  f.has[1] = miss.empty();
  f.missing[1] = miss;

  need((x & 0xe0) == 0xe0, "OS-enabled AVX-512 state (XCR0 bits 5-7)");
  need(bit(l7.b, 16), "AVX512F");
  need(bit(l7.b, 30), "AVX512BW");
  need(bit(l7.b, 31), "AVX512VL");
  need(bit(l7.b, 17), "AVX512DQ");
  need(bit(l7.c, 11), "AVX512-VNNI");
  f.has[2] = miss.empty();
  f.missing[2] = miss;

  need(bit(l7.d, 24), "AMX-TILE");
  need(bit(l7.d, 25), "AMX-INT8");
  need(bit(l7.d, 22), "AMX-BF16");
  need(f.avx512_bf16, "AVX512-BF16");
  need((x & 0x60000) == 0x60000, "OS-enabled tile state (XCR0 bits 17-18)");
  if (miss.empty()) miss = request_amx_permission();
  f.has[3] = miss.empty();
  f.missing[3] = miss;
  return f;
}

void set_kernels(CpuKernels& k, Isa isa, MatmulFn i4, MatmulFn i8, MatmulFn b16, QuantizeRowsFn q, SwigluFn s) {
  k.isa = isa;
  k.name = isa_name(isa);
  k.matmul[static_cast<int>(WeightFormat::Int4)] = i4;
  k.matmul[static_cast<int>(WeightFormat::Int8)] = i8;
  k.matmul[static_cast<int>(WeightFormat::BF16)] = b16;
  k.quantize_rows = q;
  k.swiglu = s;
}

const CpuKernels* tables() {
  static const std::array<CpuKernels, kIsaLevels> t = [] {
    std::array<CpuKernels, kIsaLevels> k;
    set_kernels(k[0], Isa::Scalar, ref::matmul_int4, ref::matmul_int8, ref::matmul_bf16, ref::quantize_rows,
                ref::swiglu);
    set_kernels(k[1], Isa::Avx2, avx2::matmul_int4, avx2::matmul_int8, avx2::matmul_bf16, avx2::quantize_rows,
                avx2::swiglu);
    set_kernels(k[2], Isa::Avx512, avx512::matmul_int4, avx512::matmul_int8, avx512::matmul_bf16,
                avx512::quantize_rows, avx512::swiglu);
    // AMX: tile kernels for the matmuls (they fall back to AVX-512 for few rows); AVX-512 for the rest.
    set_kernels(k[3], Isa::Amx, amx::matmul_int4, amx::matmul_int8, amx::matmul_bf16, avx512::quantize_rows,
                avx512::swiglu);
    return k;
  }();
  return t.data();
}

const char* long_name(Isa isa) {
  switch (isa) {
    case Isa::Scalar: return "scalar reference";
    case Isa::Avx2: return "avx2-fma";
    case Isa::Avx512: return "avx512-vnni";
    case Isa::Amx: return "amx-int8/bf16";
  }
  return "?";
}

}  // namespace

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::Scalar: return "scalar";
    case Isa::Avx2: return "avx2";
    case Isa::Avx512: return "avx512";
    case Isa::Amx: return "amx";
  }
  return "?";
}

std::optional<Isa> parse_isa(std::string_view name) {
  std::string s(name);
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  for (int i = 0; i < kIsaLevels; ++i)
    if (s == isa_name(static_cast<Isa>(i))) return static_cast<Isa>(i);
  return std::nullopt;
}

const CpuFeatures& cpu_features() {
  static const CpuFeatures f = detect();
  return f;
}

IsaChoice choose_isa(const CpuFeatures& f, const char* max_isa) {
  Isa best = Isa::Scalar;
  for (int i = 1; i < kIsaLevels; ++i)
    if (f.has[i]) best = static_cast<Isa>(i);  // levels are cumulative: stop at the first gap
    else break;
  IsaChoice c;
  if (!max_isa || !*max_isa) {
    c.isa = best;
    c.description = str_cat("cpu experts: ", long_name(best), " (best available");
    if (best != Isa::Amx) c.description += str_cat("; no ", isa_name(static_cast<Isa>(int(best) + 1)), ": ",
                                                   f.missing[int(best) + 1]);
    c.description += ")";
    return c;
  }
  const std::optional<Isa> cap = parse_isa(max_isa);
  if (!cap)
    fail("TANDEM_MAX_ISA='", max_isa, "' is not a CPU level; use one of scalar, avx2, avx512, amx");
  if (*cap <= best) {
    c.isa = *cap;
    c.description = str_cat("cpu experts: ", long_name(*cap), " (capped by TANDEM_MAX_ISA=", max_isa,
                            *cap < best ? str_cat("; CPU has ", isa_name(best)) : std::string(), ")");
  } else {
    c.isa = best;
    c.description = str_cat("cpu experts: ", long_name(best), " (TANDEM_MAX_ISA=", max_isa,
                            " requested, but this CPU cannot run ", isa_name(static_cast<Isa>(int(best) + 1)),
                            ": ", f.missing[int(best) + 1], ")");
  }
  return c;
}

const CpuKernels& cpu_kernels(Isa isa) {
  const CpuFeatures& f = cpu_features();
  for (int i = 1; i <= static_cast<int>(isa); ++i)
    if (!f.has[i])
      fail("cpu experts: ", isa_name(isa), " kernels requested, but this CPU (", f.brand, ") lacks ", f.missing[i]);
  return tables()[static_cast<int>(isa)];
}

const IsaChoice& default_isa() {
  static const IsaChoice c = choose_isa(cpu_features(), std::getenv("TANDEM_MAX_ISA"));
  return c;
}

}  // namespace tandem::cpu
