// core/limits.h: bounds on what a user may ask for, the same for the CLI flags, the placement YAML
// and the Python bindings.
#pragma once

namespace tandem {

constexpr int kMaxThreads = 4096;  // --threads, cpu.threads, Engine(threads=): more is a typo
constexpr int kMaxBatch = 256;     // --batch, batch:, Engine(batch=): sequences a runner holds at once
constexpr int kMaxDraft = 16;      // --draft, speculative.draft: tokens the MTP head drafts a step

}  // namespace tandem
