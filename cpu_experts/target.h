// cpu_experts/target.h: per-function instruction-set targets for the kernel files.
//
// Each ISA's code is compiled with one of these attributes on every function (never global -m flags),
// so one binary runs everywhere and isa.cpp alone decides which functions are called. Files that use
// them stay free of std:: templates: an inline template instantiated inside a target function could be
// merged by the linker into code the scalar path runs ("Illegal instruction" on older CPUs).
#pragma once

#define TANDEM_TARGET_AVX2 __attribute__((target("avx2,fma,f16c")))
#define TANDEM_TARGET_AVX512 \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")))
#define TANDEM_TARGET_AVX512_BF16 \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx512bf16,avx2,fma,f16c")))
#define TANDEM_TARGET_AMX                                                                               \
  __attribute__((target("amx-tile,amx-int8,amx-bf16,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni," \
                        "avx512bf16,avx2,fma,f16c")))
