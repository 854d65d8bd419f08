#include "runtime/format/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>

#include "core/error.h"
#include "core/file_io.h"

namespace tandem {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

// The safetensors reference implementation caps headers at 100 MB; so do we, before parsing.
constexpr uint64_t kMaxHeaderBytes = 100ull << 20;
// A valid header nests three levels deep; refusing deep nesting keeps a hostile file from
// exhausting the stack of the JSON parser.
constexpr int kMaxJsonDepth = 16;

bool nesting_too_deep(std::string_view s) {
  int depth = 0;
  bool in_string = false, escaped = false;
  for (char c : s) {
    if (in_string) {
      if (escaped) escaped = false;
      else if (c == '\\') escaped = true;
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > kMaxJsonDepth) return true;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return false;
}

bool mul_overflows(uint64_t a, uint64_t b, uint64_t* out) { return __builtin_mul_overflow(a, b, out); }

}  // namespace

int64_t TensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string TensorInfo::shape_str() const {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

std::vector<TensorInfo> parse_safetensors_header(std::string_view header_json, uint64_t data_size,
                                                 const std::string& file) {
  if (nesting_too_deep(header_json)) fail(file, ": safetensors header nests JSON deeper than ", kMaxJsonDepth);
  json root;
  try {
    root = json::parse(header_json.begin(), header_json.end());
  } catch (const json::exception& e) {
    fail(file, ": safetensors header is not valid JSON (", e.what(), ")");
  }
  if (!root.is_object()) fail(file, ": safetensors header is not a JSON object");

  std::vector<TensorInfo> out;
  out.reserve(root.size());
  for (auto it = root.begin(); it != root.end(); ++it) {
    const std::string& name = it.key();
    if (name == "__metadata__") {
      if (!it->is_object()) fail(file, ": __metadata__ is not a JSON object");
      continue;
    }
    const json& e = *it;
    auto where = [&] { return str_cat(file, ": tensor '", name, "'"); };
    if (!e.is_object()) fail(where(), ": header entry is not an object");
    if (!e.contains("dtype") || !e["dtype"].is_string()) fail(where(), ": missing or non-string 'dtype'");
    if (!e.contains("shape") || !e["shape"].is_array()) fail(where(), ": missing or non-array 'shape'");
    if (!e.contains("data_offsets") || !e["data_offsets"].is_array() || e["data_offsets"].size() != 2)
      fail(where(), ": 'data_offsets' must be an array [begin, end]");

    TensorInfo t;
    t.name = name;
    const std::string dtype = e["dtype"].get<std::string>();
    auto dt = dtype_from_name(dtype);
    if (!dt) fail(where(), ": unknown dtype '", dtype, "'");
    t.dtype = *dt;

    uint64_t numel = 1;
    for (const json& d : e["shape"]) {
      if (!d.is_number_unsigned()) fail(where(), ": shape entries must be non-negative integers");
      const uint64_t v = d.get<uint64_t>();
      if (v > (1ull << 40) || mul_overflows(numel, v, &numel)) fail(where(), ": shape is too large");
      t.shape.push_back(static_cast<int64_t>(v));
    }
    for (const json& o : e["data_offsets"])
      if (!o.is_number_unsigned()) fail(where(), ": data_offsets must be non-negative integers");
    const uint64_t begin = e["data_offsets"][0].get<uint64_t>();
    const uint64_t end = e["data_offsets"][1].get<uint64_t>();
    if (begin > end) fail(where(), ": data_offsets begin ", begin, " > end ", end);
    if (end > data_size)
      fail(where(), ": data_offsets end ", end, " is past the end of the data section (", data_size,
           " bytes; the file is truncated or the header is wrong)");
    uint64_t expected = 0;
    if (mul_overflows(numel, static_cast<uint64_t>(dtype_size(t.dtype)), &expected))
      fail(where(), ": shape is too large");
    if (end - begin != expected)
      fail(where(), ": shape ", t.shape_str(), " x ", dtype, " needs ", expected, " bytes but data_offsets span ",
           end - begin);
    t.offset = begin;
    t.nbytes = end - begin;
    out.push_back(std::move(t));
  }

  std::sort(out.begin(), out.end(), [](const TensorInfo& a, const TensorInfo& b) {
    return a.offset != b.offset ? a.offset < b.offset : a.nbytes < b.nbytes;
  });
  for (size_t i = 1; i < out.size(); ++i) {
    const TensorInfo& p = out[i - 1];
    const TensorInfo& c = out[i];
    if (c.offset < p.offset + p.nbytes)
      fail(file, ": tensors '", p.name, "' and '", c.name, "' overlap in the data section");
  }
  return out;
}

MappedFile MappedFile::open_readonly(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);  // a FIFO must not block the open
  if (fd < 0) fail(path, ": cannot open (", std::strerror(errno), ")");
  struct stat st{};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    fail(path, ": cannot stat (", std::strerror(err), ")");
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    fail(path, ": not a regular file (a directory, FIFO or device cannot be memory-mapped as a checkpoint)");
  }
  MappedFile m;
  m.path_ = path;
  m.size_ = static_cast<uint64_t>(st.st_size);
  if (m.size_ > 0) {
    void* p = ::mmap(nullptr, m.size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      const int err = errno;
      ::close(fd);
      fail(path, ": cannot memory-map (", std::strerror(err), ")");
    }
    m.data_ = static_cast<const std::byte*>(p);
  }
  ::close(fd);
  return m;
}

MappedFile::MappedFile(MappedFile&& o) noexcept { *this = std::move(o); }

MappedFile& MappedFile::operator=(MappedFile&& o) noexcept {
  if (this != &o) {
    if (data_) ::munmap(const_cast<std::byte*>(data_), size_);
    path_ = std::move(o.path_);
    data_ = std::exchange(o.data_, nullptr);
    size_ = std::exchange(o.size_, 0);
  }
  return *this;
}

MappedFile::~MappedFile() {
  if (data_) ::munmap(const_cast<std::byte*>(data_), size_);
}

std::unique_ptr<SafetensorsFile> SafetensorsFile::open(const std::string& path) {
  auto f = std::make_unique<SafetensorsFile>();
  f->map_ = MappedFile::open_readonly(path);
  const uint64_t size = f->map_.size();
  if (size < 8) fail(path, ": file is ", size, " bytes, too short for a safetensors header (truncated?)");
  uint64_t header_len = 0;
  std::memcpy(&header_len, f->map_.data(), 8);  // little-endian on every platform we build for
  if (header_len > kMaxHeaderBytes) fail(path, ": header length ", header_len, " is larger than the 100 MB limit");
  if (header_len > size - 8)
    fail(path, ": header length ", header_len, " is past the end of the file (", size, " bytes; truncated?)");
  f->data_start_ = 8 + header_len;
  const std::string_view header(reinterpret_cast<const char*>(f->map_.data() + 8), header_len);
  f->tensors_ = parse_safetensors_header(header, size - f->data_start_, path);
  return f;
}

Checkpoint Checkpoint::open(const std::string& dir) {
  if (!fs::is_directory(dir)) fail(dir, ": not a directory (expected a model folder with config.json and *.safetensors)");
  Checkpoint c;
  c.dir_ = dir;
  const fs::path index = fs::path(dir) / "model.safetensors.index.json";
  const fs::path single = fs::path(dir) / "model.safetensors";
  if (fs::exists(index)) {
    const std::string text = read_text_file(index.string(), kMaxHeaderBytes, "the safetensors index");
    json j;
    try {
      j = json::parse(text);
    } catch (const json::exception& e) {
      fail(index.string(), ": not valid JSON (", e.what(), ")");
    }
    if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
      fail(index.string(), ": missing object 'weight_map'");
    std::set<std::string> shard_names;
    for (auto& [name, file] : j["weight_map"].items()) {
      if (!file.is_string()) fail(index.string(), ": weight_map['", name, "'] is not a file name");
      const std::string f = file.get<std::string>();
      if (f.find('/') != std::string::npos) fail(index.string(), ": weight_map['", name, "'] = '", f, "' is not a plain file name");
      shard_names.insert(f);
    }
    for (const auto& s : shard_names) {
      const fs::path p = fs::path(dir) / s;
      if (!fs::exists(p)) fail(index.string(), ": lists shard '", s, "' which does not exist in ", dir);
      c.add_file(SafetensorsFile::open(p.string()));
    }
    for (auto& [name, file] : j["weight_map"].items()) {
      const TensorRef* t = c.find(name);
      if (!t) fail(index.string(), ": tensor '", name, "' is listed in shard '", file.get<std::string>(), "' but not present there");
      if (fs::path(*t->file).filename() != file.get<std::string>())
        fail(index.string(), ": tensor '", name, "' is listed in shard '", file.get<std::string>(), "' but found in ", *t->file);
    }
  } else if (fs::exists(single)) {
    c.add_file(SafetensorsFile::open(single.string()));
  } else {
    std::vector<fs::path> found;
    for (const auto& e : fs::directory_iterator(dir))
      if (e.path().extension() == ".safetensors") found.push_back(e.path());
    if (found.empty()) fail(dir, ": no model.safetensors, model.safetensors.index.json or *.safetensors file");
    std::sort(found.begin(), found.end());
    for (const auto& p : found) c.add_file(SafetensorsFile::open(p.string()));
  }
  return c;
}

void Checkpoint::add_file(std::unique_ptr<SafetensorsFile> f) {
  for (const TensorInfo& t : f->tensors()) {
    TensorRef ref{&t, f->data_of(t), &f->path()};
    auto [it, inserted] = tensors_.emplace(t.name, ref);
    if (!inserted) fail(dir_, ": tensor '", t.name, "' appears in both ", *it->second.file, " and ", f->path());
  }
  files_.push_back(std::move(f));
}

const TensorRef* Checkpoint::find(std::string_view name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

const TensorRef& Checkpoint::get(std::string_view name) const {
  const TensorRef* t = find(name);
  if (!t) fail(dir_, ": tensor '", name, "' is missing from the checkpoint");
  return *t;
}

const TensorRef& Checkpoint::get(std::string_view name, const std::vector<int64_t>& shape,
                                 std::initializer_list<DType> dtypes) const {
  const TensorRef& t = get(name);
  if (t.shape() != shape) {
    TensorInfo want;
    want.shape = shape;
    fail(*t.file, ": tensor '", name, "' has shape ", t.info->shape_str(), ", expected ", want.shape_str());
  }
  if (std::find(dtypes.begin(), dtypes.end(), t.dtype()) == dtypes.end()) {
    std::string ok;
    for (DType d : dtypes) ok += (ok.empty() ? "" : " or ") + std::string(dtype_name(d));
    fail(*t.file, ": tensor '", name, "' has dtype ", dtype_name(t.dtype()), ", expected ", ok);
  }
  return t;
}

std::vector<std::string> Checkpoint::names() const {
  std::vector<std::string> out;
  out.reserve(tensors_.size());
  for (const auto& [k, v] : tensors_) out.push_back(k);
  return out;
}

uint64_t Checkpoint::total_bytes() const {
  uint64_t n = 0;
  for (const auto& [k, v] : tensors_) n += v.info->nbytes;
  return n;
}

}  // namespace tandem
