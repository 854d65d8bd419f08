// core/bytes.h: byte sizes as people write them ("24GiB", "512MiB", "16GB") and read them.
#pragma once

#include <cstdint>
#include <string>

namespace tandem {

// Parses a positive size with an optional unit (B, KiB/K, MiB/M, GiB/G, TiB/T, KB, MB, GB, TB; case-insensitive);
// throws tandem::Error naming `what` (e.g. "--gpu-mem") on anything else.
uint64_t parse_bytes(const std::string& text, const std::string& what);
// The same, with "0" meaning off (a budget that may be switched off: the prefix cache's).
uint64_t parse_bytes_or_zero(const std::string& text, const std::string& what);
// "1.25 GiB"
std::string format_gib(uint64_t bytes);

}  // namespace tandem
