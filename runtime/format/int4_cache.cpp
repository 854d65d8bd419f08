#include "runtime/format/int4_cache.h"

#include <fcntl.h>
#include <pwd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <system_error>

#include "core/error.h"
#include "core/progress.h"
#include "core/quantize_int4.h"
#include "runtime/format/safetensors_stream.h"

namespace tandem {

namespace fs = std::filesystem;

namespace {

constexpr const char* kStamp = "tandem-int4.json";
constexpr uint64_t kShardBytes = 4ull << 30;

struct Fnv {
  uint64_t h = 0xcbf29ce484222325ull;
  void bytes(const void* p, size_t n) {
    for (size_t i = 0; i < n; ++i) h = (h ^ static_cast<const uint8_t*>(p)[i]) * 0x100000001b3ull;
  }
  void str(const std::string& s) {
    bytes(s.data(), s.size());
    num(0xff);  // separator: "ab","c" differs from "a","bc"
  }
  void num(int64_t v) { bytes(&v, sizeof v); }
};

// The source files that enter the key: every safetensors file of the checkpoint's folder.
std::vector<fs::path> source_files(const std::string& model_dir) {
  std::vector<fs::path> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(model_dir, ec))
    if (e.is_regular_file() && e.path().extension() == ".safetensors") out.push_back(e.path());
  std::sort(out.begin(), out.end());
  return out;
}

std::string cache_key(const std::string& model_dir, const std::vector<const LinearWeight*>& matrices, int64_t group) {
  Fnv f;
  f.num(kInt4QuantizerVersion);
  f.num(group);
  for (const LinearWeight* w : matrices) {
    f.str(w->name);
    f.num(w->out), f.num(w->in), f.num(static_cast<int64_t>(w->dense_dtype));
  }
  for (const fs::path& p : source_files(model_dir)) {
    std::error_code ec;
    f.str(p.filename().string());
    f.num(static_cast<int64_t>(fs::file_size(p, ec)));
    f.num(static_cast<int64_t>(fs::last_write_time(p, ec).time_since_epoch().count()));
  }
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(f.h));
  return hex;
}

// Flushes a written file (or folder) to the disk: a stamp must never name data a crash could lose.
void sync_path(const fs::path& p) {
  const int fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail(p.string(), ": cannot open to flush it (", std::strerror(errno), ")");
  const int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) fail(p.string(), ": flushing it to the disk failed (", std::strerror(errno), ")");
}

// The stamp of the cache in `dir`; an empty object when it has none or an unreadable one.
nlohmann::json read_stamp(const fs::path& dir) {
  std::ifstream in(dir / kStamp);
  nlohmann::json j = in ? nlohmann::json::parse(in, nullptr, false) : nlohmann::json::object();
  return j.is_object() ? j : nlohmann::json::object();
}

// Whether `dir` holds a finished cache for `key`.
bool finished(const fs::path& dir, const std::string& key) {
  const nlohmann::json j = read_stamp(dir);
  return j.value("key", "") == key && j.value("quantizer", 0) == kInt4QuantizerVersion;
}

// Where the cache of these matrices lives: its root (the default without one), key and folder.
struct Place {
  std::string root, key;
  fs::path dir;
};
Place place_of(const std::string& model_dir, const std::string& root, const std::vector<const LinearWeight*>& matrices, int64_t group) {
  Place p{root.empty() ? default_int4_cache_root(model_dir) : root, cache_key(model_dir, matrices, group), {}};
  p.dir = fs::path(p.root) / ("int4-" + p.key);
  return p;
}

void build(const fs::path& dir, const std::string& key, const std::string& model_dir, const std::vector<const LinearWeight*>& matrices,
           int64_t group, std::FILE* log) {
  std::vector<TensorSpec> specs;
  for (const LinearWeight* w : matrices) {
    specs.push_back({w->name + ".qweight", DType::I32, {w->in / 8, w->out}});
    specs.push_back({w->name + ".qzeros", DType::I32, {w->in / group, w->out / 8}});
    specs.push_back({w->name + ".scales", DType::F16, {w->in / group, w->out}});
  }
  SafetensorsStreamWriter writer(dir.string(), specs, kShardBytes);
  writer.open();
  if (writer.tensor_bytes() < (1ull << 30)) log = nullptr;  // a small model's second or so: nothing to follow
  if (log) std::fprintf(log, "tandem: quantizing %zu expert matrices to int4 (once: cached for later starts)\n", matrices.size());
  Progress progress(log, writer.tensor_bytes(), "int4 experts");
  const auto t0 = std::chrono::steady_clock::now();
  auto secs = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); };
  uint64_t done = 0;
  std::vector<int32_t> qweight, qzeros;
  std::vector<uint16_t> scales;
  for (size_t i = 0; i < matrices.size(); ++i) {
    const LinearWeight& w = *matrices[i];
    qweight.resize(static_cast<size_t>(w.in / 8 * w.out));
    qzeros.resize(static_cast<size_t>(w.in / group * w.out / 8));
    scales.resize(static_cast<size_t>(w.in / group * w.out));
    quantize_int4_gptq(w, group, qweight.data(), qzeros.data(), scales.data());
    const void* data[3] = {qweight.data(), qzeros.data(), scales.data()};
    for (size_t t = 0; t < 3; ++t) {
      const size_t ti = 3 * i + t;
      const auto& loc = writer.location(ti);
      writer.write(loc.shard, loc.file_offset, data[t], specs[ti].nbytes());
      done += specs[ti].nbytes();
    }
    progress.show(done, secs(), false);
  }
  writer.finish();
  for (const std::string& f : writer.written_files()) sync_path(f);
  progress.show(done, secs(), true);
  nlohmann::json stamp = {{"key", key},
                          {"quantizer", kInt4QuantizerVersion},
                          {"source", fs::absolute(model_dir).string()},
                          {"matrices", matrices.size()},
                          {"group_size", group},
                          {"format", "GPTQ int4, v2 zeros (asymmetric), f16 scales"}};
  std::ofstream out(dir / kStamp);
  out << stamp.dump(2) << "\n";
  if (!out.flush()) fail(dir.string(), ": cannot write ", kStamp);
  out.close();
  sync_path(dir / kStamp);
  sync_path(dir);
}

// Other caches of the same checkpoint folder under `root` (made before it or the quantizer changed):
// each would hold a model's worth of experts on disk for nothing once the new one is in place.
void remove_stale(const std::string& root, const fs::path& keep, const std::string& model_dir, std::FILE* log) {
  const std::string source = fs::absolute(model_dir).string();
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(root, ec)) {
    const std::string name = e.path().filename().string();
    if (e.path() == keep || name.rfind("int4-", 0) != 0 || name.find(".partial-") != std::string::npos) continue;
    if (read_stamp(e.path()).value("source", "") != source) continue;
    std::error_code rm;
    fs::remove_all(e.path(), rm);
    if (log && !rm) std::fprintf(log, "tandem: removed %s, an int4 cache of an earlier state of this checkpoint\n", e.path().c_str());
  }
}

}  // namespace

LinearWeight Int4Cache::view(const std::string& module, int64_t out, int64_t in) const {
  const int64_t g = group;
  const Checkpoint& c = *tensors;
  return int4_gptq_view(module, out, in, g, c.get(module + ".qweight", {in / 8, out}, {DType::I32}).as<int32_t>(),
                        c.get(module + ".qzeros", {in / g, out / 8}, {DType::I32}).as<int32_t>(),
                        c.get(module + ".scales", {in / g, out}, {DType::F16}).as<uint16_t>());
}

std::string default_int4_cache_root(const std::string& model_dir) {
  if (::access(model_dir.c_str(), W_OK) == 0) return (fs::path(model_dir) / ".tandem-cache").string();
  // The user's home from the password database (the engine reads no environment here: layout check).
  if (const passwd* pw = ::getpwuid(::getuid()); pw && pw->pw_dir && *pw->pw_dir) return (fs::path(pw->pw_dir) / ".cache" / "tandem").string();
  fail(model_dir, ": the folder cannot be written and this user has no home folder: give --quant-cache DIR for the int4 cache");
}

Int4CacheStatus int4_cache_status(const std::string& model_dir, const std::string& root, const std::vector<const LinearWeight*>& matrices,
                                  int64_t group) {
  const Place p = place_of(model_dir, root, matrices, group);
  return {p.dir.string(), finished(p.dir, p.key)};
}

Int4Cache open_int4_cache(const std::string& model_dir, const std::string& root_in, const std::vector<const LinearWeight*>& matrices,
                          int64_t group, std::FILE* log) {
  for (const LinearWeight* w : matrices)
    if (w->kind != LinearWeight::Kind::Dense || group <= 0 || group % 8 != 0 || w->in % group != 0 || w->out % 8 != 0)
      fail("int4 on load: '", w->name, "' (", w->out, "x", w->in, ") cannot be quantized in groups of ", group,
           ": it needs a floating-point matrix with rows in multiples of 8 and inputs in multiples of the group (32 at least)");
  const auto t0 = std::chrono::steady_clock::now();
  const Place where = place_of(model_dir, root_in, matrices, group);
  const std::string& root = where.root;
  const std::string& key = where.key;
  const fs::path& dir = where.dir;
  Int4Cache c;
  c.dir = dir.string();
  c.group = group;
  auto make = [&] {
    std::error_code ec;
    fs::create_directories(root, ec);
    if (ec) fail(root, ": cannot create the int4 cache folder (", ec.message(), "); give --quant-cache DIR, a folder that can be written");
    const fs::path tmp = fs::path(root) / ("int4-" + key + ".partial-" + std::to_string(::getpid()));
    fs::remove_all(tmp, ec);
    fs::create_directories(tmp, ec);
    if (ec) fail(tmp.string(), ": cannot create (", ec.message(), "); give --quant-cache DIR, a folder that can be written");
    try {
      build(tmp, key, model_dir, matrices, group, log);
    } catch (...) {
      fs::remove_all(tmp, ec);
      throw;
    }
    fs::remove_all(dir, ec);  // an unfinished or damaged folder of the same key
    fs::rename(tmp, dir, ec);
    if (ec) {  // another process renamed its copy first: keep that one
      std::error_code ec2;
      fs::remove_all(tmp, ec2);
      if (!finished(dir, key)) fail(dir.string(), ": cannot move the new int4 cache into place (", ec.message(), ")");
    } else {
      c.built = true;
      sync_path(root);  // the rename itself
      remove_stale(root, dir, model_dir, log);
    }
  };
  // The cache's tensors, every one checked against what it must hold (a damaged file is an error here,
  // not a wrong weight later).
  auto open = [&] {
    c.tensors = std::make_unique<Checkpoint>(Checkpoint::open(c.dir));
    for (const LinearWeight* w : matrices) (void)c.view(w->name, w->out, w->in);
  };
  if (!finished(dir, key)) make();
  try {
    open();
  } catch (const Error& e) {
    if (c.built) throw;
    if (log) std::fprintf(log, "tandem: the int4 cache in %s is damaged (%s); quantizing again\n", c.dir.c_str(), e.what());
    c.tensors.reset();
    make();
    open();
  }
  c.bytes = c.tensors->total_bytes();
  c.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return c;
}

}  // namespace tandem
