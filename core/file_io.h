// core/file_io.h: reading and writing the small files Tandem trusts nothing about.
//
// read_text_file is how every text input is read (config.json, generation_config.json, tokenizer.json,
// the safetensors index, placement YAML, heat maps, prompt and id files): a regular file only (a
// directory, FIFO, device or socket is refused before anything is read, so /dev/zero cannot grow
// memory and a FIFO cannot hang), at most max_bytes, with an error that names the file, what it was
// for, and why (missing, symlink loop, permission, too large).
//
// write_file_atomic writes `name.tmp.<pid>`, checks every write, fsync and close, then renames it to
// `name`: a full disk or a crash never leaves a truncated file under the final name (the temporary is
// removed on failure).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace tandem {

// The whole file; tandem::Error "<path>: cannot read <what>: <reason>" where it is not a readable
// regular file of at most max_bytes.
std::string read_text_file(const std::string& path, uint64_t max_bytes, std::string_view what);
// The limit for text the user hands a command (--file, --prompts, @ids files).
constexpr uint64_t kMaxPromptFileBytes = uint64_t{1} << 30;

void write_file_atomic(const std::string& path, std::string_view contents);

}  // namespace tandem
