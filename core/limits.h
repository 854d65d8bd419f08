// core/limits.h: bounds on what a user may ask for, the same for the CLI flags, the placement YAML
// and the Python bindings.
#pragma once

namespace tandem {

constexpr int kMaxThreads = 4096;  // --threads, cpu.threads, Engine(threads=): more is a typo
constexpr int kMaxBatch = 256;     // --batch, batch:, Engine(batch=): sequences a runner holds at once
constexpr int kMaxDraft = 16;      // --draft, speculative.draft: tokens the MTP head drafts a step
// --draft auto, speculative.draft: auto (the value RunnerOptions::draft and GenerateRequest::draft
// carry): the runner drafts up to kAutoDraftMax and each step takes what its DraftTuner picks.
constexpr int kDraftAuto = -1;
constexpr int kAutoDraftMax = 4;
// Drafts a runner holds room for: the count, or kAutoDraftMax for auto.
constexpr int drafts_held(int draft) { return draft == kDraftAuto ? kAutoDraftMax : draft; }

}  // namespace tandem
