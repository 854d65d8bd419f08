// cpu_experts/isa.h: the one place the CPU instruction set for expert kernels is chosen.
//
// Levels (each needs the previous one's features too):
//  - scalar: portable C++ (the reference arithmetic).
//  - avx2:   AVX2 + FMA + F16C, OS-enabled YMM state (XCR0 bits 1, 2).
//  - avx512: AVX-512 F/BW/VL/DQ + VNNI, OS-enabled ZMM state (XCR0 bits 5-7). AVX512-BF16 is reported
//            but not needed (bf16 weights are widened to fp32 in the decode kernels).
//  - amx:    AMX-TILE/INT8/BF16 + AVX512-BF16, XCR0 bits 17/18, and Linux granting tile data
//            (arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)).
// The environment variable TANDEM_MAX_ISA=scalar|avx2|avx512|amx caps the level (so lower paths can
// be tested on the top machine); asking for a level the CPU lacks falls back to the best one below it
// with the reason in the description. cpu_kernels(isa) throws tandem::Error when a level is not
// available, so no kernel ever runs on a CPU without its instructions.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "cpu_experts/act_ops.h"
#include "cpu_experts/qmatmul.h"

namespace tandem::cpu {

enum class Isa : uint8_t { Scalar = 0, Avx2 = 1, Avx512 = 2, Amx = 3 };
constexpr int kIsaLevels = 4;

const char* isa_name(Isa isa);                        // "scalar", "avx2", "avx512", "amx"
std::optional<Isa> parse_isa(std::string_view name);  // accepts the names above (case-insensitive)

struct CpuFeatures {
  bool has[kIsaLevels] = {true, false, false, false};  // usable level by level
  std::string missing[kIsaLevels];                     // why a level is unusable (empty when usable)
  bool avx512_bf16 = false, avx_vnni = false;
  std::string brand;  // cpuid brand string
};

// Detected once per process (cpuid + xgetbv; requests AMX tile permission from Linux on first use).
const CpuFeatures& cpu_features();

// Kernel table of one level. Every entry is non-null.
struct CpuKernels {
  Isa isa = Isa::Scalar;
  const char* name = "scalar";
  MatmulFn matmul[3] = {};  // by WeightFormat: int4, int8, bf16
  QuantizeRowsFn quantize_rows = nullptr;
  SwigluFn swiglu = nullptr;
};

struct IsaChoice {
  Isa isa = Isa::Scalar;
  std::string description;  // e.g. "cpu experts: avx512-vnni (capped by TANDEM_MAX_ISA=avx512; CPU has amx)"
};

// The policy, pure for tests: best available level, capped by `max_isa` (the env value; null or empty
// means no cap). Throws tandem::Error for an unknown value.
IsaChoice choose_isa(const CpuFeatures& f, const char* max_isa);

// Table for one level; throws tandem::Error naming the missing feature when unavailable.
const CpuKernels& cpu_kernels(Isa isa);

// choose_isa(cpu_features(), getenv("TANDEM_MAX_ISA")), evaluated once; what the runtime uses.
const IsaChoice& default_isa();
inline const CpuKernels& default_cpu_kernels() { return cpu_kernels(default_isa().isa); }

}  // namespace tandem::cpu
