// runtime/format/int4_cache.h: matrices quantized to int4 when a model is loaded (core/quantize_int4.h),
// kept on disk so that a later start maps them instead of quantizing them again.
//
// A cache is a folder `int4-<key>` under a root, holding a safetensors checkpoint with the GPTQ
// tensors `<module>.qweight / .qzeros / .scales` of every matrix asked for, and `tandem-int4.json`
// (written last: a folder without it is incomplete). The key hashes the quantizer's version, the
// group, each matrix's name, shape and dtype, and the source checkpoint's safetensors files (names, sizes,
// modification times): a changed checkpoint or quantizer makes a new folder, never a stale read.
// A cache is built under a temporary name, flushed to the disk, stamped and renamed into place, so an
// interrupted build (or a crash) leaves nothing that loads; two processes building the same one both succeed (the second keeps the first's).
// Opening checks every tensor it must hold; a damaged cache is built again. Once a new cache is in
// place, the folder's caches of the same checkpoint made earlier (another state of its files, another
// quantizer version) are removed.
#pragma once

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "core/weights.h"
#include "runtime/format/safetensors.h"

namespace tandem {

struct Int4Cache {
  std::unique_ptr<Checkpoint> tensors;  // the cached GPTQ tensors, mapped
  std::string dir;                      // the cache's folder
  bool built = false;                   // quantized now (false: found on disk)
  double seconds = 0;                   // to build or to open
  uint64_t bytes = 0;                   // the tensors' bytes
  int64_t group = 0;                    // inputs per scale and zero point, every matrix
  // The view of the matrix cached under `module` (src->name when it was asked for), as the loader
  // makes one of a GPTQ checkpoint's.
  LinearWeight view(const std::string& module, int64_t out, int64_t in) const;
};

// Where caches go without --quant-cache: `<model_dir>/.tandem-cache` when that folder can be written,
// else ~/.cache/tandem (the user's home folder from the password database).
std::string default_int4_cache_root(const std::string& model_dir);

// The cache of `matrices` (dense, named, each quantizable in groups of `group`: core/quantize_int4.h)
// for the checkpoint in `model_dir`, under `root` ("": the default): opened when it exists, else
// built, showing progress on `log` (nullptr: silent). tandem::Error naming the matrix that cannot be
// quantized, or the folder that cannot be written.
Int4Cache open_int4_cache(const std::string& model_dir, const std::string& root, const std::vector<const LinearWeight*>& matrices,
                          int64_t group, std::FILE* log);
// Where that cache is, and whether it is there finished (tandem info: will the next start quantize?).
// Reads the stamp only: no quantizing, no writing.
struct Int4CacheStatus {
  std::string dir;
  bool finished = false;
};
Int4CacheStatus int4_cache_status(const std::string& model_dir, const std::string& root, const std::vector<const LinearWeight*>& matrices,
                                  int64_t group);

}  // namespace tandem
